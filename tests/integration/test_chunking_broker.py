"""Chunking through a broker that caps message size: a real Mosquitto with ``max_packet_size``.

The jetson family's global state and updates (cnn_large, about 500 KB) are larger than the
broker lets through, so the coordinator and the agents split them into chunks below the cap
(``max_message_bytes``) and the other side puts them back together. An independent subscriber
checks that nothing on the wire was over the cap, that chunks carried the large payloads, and
that the chunks reassemble into the global states and updates the rounds were made of.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import Chunk, GlobalState, Update
from protocol.topics import ParsedTopic, Topics
from protocol.transport.chunking import Reassembler
from protocol.wire import decode_message
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    wait_for_rounds,
)

pytestmark = pytest.mark.integration

FEDERATION = "capped"
ROUNDS = 2
BROKER_CAP = 256 * 1024
"""Mosquitto's max_packet_size: below a cnn_large state (about 500 KB)."""
MAX_MESSAGE = 128 * 1024
"""What the coordinator and the agents send at most (AWS IoT Core's limit), well below the cap."""
AGENTS = [AgentSpec("jetson-0", "jetson", 0), AgentSpec("jetson-1", "jetson", 1), AgentSpec("rpi-2", "rpi", 2)]


def test_large_states_and_updates_cross_a_capped_broker_in_chunks(tmp_path: Path) -> None:
    spec = FleetSpec(agents=AGENTS, alpha=1.0, agent_settings={"max_message_bytes": MAX_MESSAGE})
    with (MosquittoBroker(workdir=tmp_path / "broker", max_packet_bytes=BROKER_CAP) as broker,
          WireRecorder(broker.url, "fl/#") as recorder):
        fleet = Fleet(tmp_path / "run", broker.url, spec, {
            "rounds": ROUNDS, "min_available_agents": len(AGENTS), "min_fit_agents": len(AGENTS),
            "local_epochs": 1, "round_deadline_s": 120, "max_message_bytes": MAX_MESSAGE,
        }, federation=FEDERATION)
        with fleet:
            rounds = wait_for_rounds(fleet, ROUNDS + 1, 240)  # two rounds and the evaluation
            assert_agents_exit_cleanly(fleet, 60)
        with WireRecorder(broker.url, f"fl/{FEDERATION}/global/#", client_id="late-joiner") as late:
            retained = wait_for_retained_states(late, {"cnn_large", "cnn_small"}, 60)
        broker_log = broker.log_path.read_text(errors="replace")
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == r["selected"] == len(AGENTS) for r in rounds), rounds
    assert "oversize packet" not in broker_log, broker_log  # what Mosquitto logs when it cuts a client off

    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot(lambda m: bool(m.payload))]
    too_large = [(m.topic, len(m.payload)) for _, m in seen if len(m.payload) > MAX_MESSAGE]
    assert not too_large, too_large

    # A subscriber that arrives after the run gets every family's final state from what is retained,
    # the chunked one included (each chunk is retained on its own topic), and nothing superseded.
    assert {(s.family, s.round) for s in retained} == {("cnn_large", ROUNDS + 1), ("cnn_small", ROUNDS + 1)}

    # Put the chunks back together per state or update, as the receivers do; keep whole messages as they are.
    reassembler = Reassembler()
    whole: list[tuple[str, bytes]] = []
    chunked: set[tuple[str, str]] = set()  # (kind, family or agent) that travelled in chunks
    for parsed, message in seen:
        if parsed.kind not in ("global_state", "update"):
            continue
        decoded = decode_message(message.payload)
        if not isinstance(decoded, Chunk):
            whole.append((message.topic, message.payload))
            continue
        chunked.add((parsed.kind, parsed.family or parsed.agent_id or ""))
        payload = reassembler.add(transfer_key(topics, parsed, message.topic), decoded)
        if payload is not None:
            assert len(payload) > BROKER_CAP, (message.topic, len(payload))  # only what could not pass whole
            whole.append((message.topic, payload))
    assert reassembler.in_flight == 0, "a chunked transfer never completed"
    assert chunked == {("global_state", "cnn_large"), ("update", "jetson-0"), ("update", "jetson-1")}

    states = [decode_wire(payload, GlobalState) for topic, payload in whole if "/global/" in topic]
    # Round 1 bootstraps every family from its agents; global states follow each aggregation.
    assert {(s.family, s.round) for s in states} == {(f, n) for f in ("cnn_large", "cnn_small")
                                                     for n in range(2, ROUNDS + 2)}
    updates = [decode_wire(payload, Update) for topic, payload in whole if "/updates/" in topic]
    trained = {(u.agent_id, u.round) for u in updates if u.task == "train"}
    assert trained == {(a.name, n) for a in AGENTS for n in range(1, ROUNDS + 1)}
    for update in updates:
        if update.family == "cnn_large" and update.task == "train":
            assert sum(a.nbytes for a in (update.weights or update.delta).values()) > BROKER_CAP


def transfer_key(topics: Topics, parsed: ParsedTopic, topic: str) -> str:
    """Chunks of one global state arrive on one topic per chunk: key them by the state's topic."""
    return topics.global_state(parsed.family, parsed.round) if parsed.kind == "global_state" else topic  # type: ignore[arg-type]


def wait_for_retained_states(recorder: WireRecorder, families: set[str], timeout_s: float) -> list[GlobalState]:
    """The global states ``recorder`` received (retained ones, for a late subscriber), once it holds
    one whole state of every family; fails after ``timeout_s``."""
    topics = Topics(FEDERATION)
    deadline = time.monotonic() + timeout_s
    while True:
        reassembler, states = Reassembler(), []
        for message in recorder.snapshot(lambda m: bool(m.payload)):
            parsed = topics.parse(message.topic)
            decoded = decode_message(message.payload)
            payload = reassembler.add(transfer_key(topics, parsed, message.topic), decoded) \
                if isinstance(decoded, Chunk) else message.payload
            if payload is not None:
                states.append(decode_wire(payload, GlobalState))
        if {s.family for s in states} >= families:
            return states
        assert time.monotonic() < deadline, f"a late subscriber got only {[(s.family, s.round) for s in states]}"
        time.sleep(0.2)
