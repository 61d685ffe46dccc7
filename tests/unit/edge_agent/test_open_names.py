"""Names a newer coordinator may announce that this agent does not know (an algorithm, a compressor):
the announcement decodes, and the agent declines with a reason instead of dropping it or crashing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edge_agent.agent import EdgeAgent
from edge_agent.algorithms import CLIENT_ALGORITHMS
from edge_agent.profiles import get_profile
from edge_agent.state import AgentStateDir
from protocol.messages import AgentStatus, RoundAnnouncement
from protocol.topics import Topics
from protocol.transport.mqtt import BrokerAddress
from protocol.wire import decode_message, encode_message

from .links import FakeLink
from .rounds import AGENT, announce, digits_subset, global_state, global_weights, make_worker

TOPICS = Topics("t")


class Link(FakeLink):
    def statuses(self) -> list[AgentStatus]:
        return [decode_message(p, AgentStatus) for t, p in self.published if t == TOPICS.agent_status(AGENT)]


def test_a_round_of_an_unknown_algorithm_decodes_and_is_refused_with_the_reason_in_the_status(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert "fedfuture" not in CLIENT_ALGORITHMS
    worker = make_worker(tmp_path / "w", digits_subset(per_class=4))
    agent = EdgeAgent(AGENT, "t", BrokerAddress("localhost", 1883), get_profile("cpu"), worker,
                      AgentStateDir(tmp_path / "agent"))
    link = Link()
    agent._link = link  # type: ignore[assignment]
    future = encode_message(announce("fedfuture", 1, params={"horizon": 3}))
    assert decode_message(future, RoundAnnouncement).algorithm == "fedfuture"  # an open name, not a schema error

    with caplog.at_level(logging.WARNING, logger="edge_agent.agent"):
        agent._on_message(TOPICS.rounds_current, future, True)
        agent._on_message(TOPICS.rounds_current, encode_message(announce("fedfuture", 2)), False)
    assert link.updates() == [] and agent.rejected.total() == 0  # skipped, not dropped as malformed
    [status] = link.statuses()  # published when the problem appeared, not again for the next round
    assert status.problem == agent.status().problem
    assert status.problem is not None and "does not implement algorithm 'fedfuture'" in status.problem
    assert [r.getMessage() for r in caplog.records].count(f"refusing rounds (task_mismatch): {status.problem}") == 1

    agent._on_message(TOPICS.rounds_current, encode_message(announce("fedavg", 1, run_id="run-2", selected=["b"])),
                      False)
    assert agent.status().problem is None and link.statuses()[-1].problem is None  # a run it can join again


def test_a_round_asking_for_an_unknown_compressor_is_answered_uncompressed_with_the_reason(tmp_path: Path) -> None:
    worker = make_worker(tmp_path, digits_subset(per_class=4), family="mlp_tiny")
    wire = encode_message(announce("fedavg", 1, epochs=1).model_copy(update={"compression": "zstd:3"}))
    ann = decode_message(wire, RoundAnnouncement)
    assert ann.compression == "zstd:3" and worker.refusal(ann) is None  # the round itself is fine
    update = worker.answer(ann, None)  # a bootstrap round: weights, never compressed
    assert update.weights and update.compression_declined is None
    state = global_state("mlp_tiny", 1, weights=global_weights("mlp_tiny"))
    ann = announce("fedavg", 2, state, epochs=1).model_copy(update={"compression": "zstd:3"})
    update = worker.answer(ann, state)
    assert update.delta and not update.packed_delta
    assert update.compression_declined == "this agent does not implement compressor zstd (it implements fp16, int8, topk)"


def test_every_algorithm_has_its_agent_half_with_the_same_payloads() -> None:
    from coordinator.strategies.registry import ALGORITHMS

    assert set(CLIENT_ALGORITHMS.names()) == set(ALGORITHMS.names())
    for entry in ALGORITHMS:
        client = CLIENT_ALGORITHMS.entry(entry.name)
        assert client.compatible["payloads"] == entry.compatible["payloads"]
        assert client.compatible["dp"] <= entry.compatible["dp"]
