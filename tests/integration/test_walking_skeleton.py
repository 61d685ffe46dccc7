"""A coordinator and four agents, as separate processes, over a real Mosquitto broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import CoordinatorStatus, GlobalState, RoundAnnouncement, Update
from protocol.topics import Topics
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    fleet_keys,
    metric,
    retained_messages,
    scrape,
    signer_of,
    wait_for_rounds,
)

pytestmark = pytest.mark.integration

FEDERATION = "skeleton"
ROUNDS = 3


def test_three_rounds_over_the_wire(tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    http_port = free_port()
    agents = [AgentSpec("jetson-0", "jetson", 0), AgentSpec("rpi-1", "rpi", 1),
              AgentSpec("phone-2", "phone", 2), AgentSpec("rpi-3", "rpi", 3)]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=1.0), {
        "rounds": ROUNDS, "min_available_agents": 4, "min_fit_agents": 4, "local_epochs": 1,
        "http_port": http_port, "exit_when_finished": False,  # keep /metrics up to read it
    }, federation=FEDERATION)
    with fleet:
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 180)  # three rounds and the evaluation
        assert_agents_exit_cleanly(fleet, 30)
        samples = scrape(http_port)
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]

    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]

    # Everything on the wire is signed: the coordinator's messages with its key, each agent's with its own.
    keys = fleet_keys(fleet)
    for parsed, message in seen:
        if message.payload and parsed.kind in ("coordinator_status", "round", "global_state", "task", "notice"):
            assert signer_of(message.payload, keys) == "coordinator", message.topic
        elif message.payload:
            assert signer_of(message.payload, keys) == parsed.agent_id, message.topic

    # Every update on the wire decodes, matches its topic, and carries what its round asked for.
    updates = [(parsed, m) for parsed, m in seen if parsed.kind == "update"]
    assert len(updates) == len(agents) * (ROUNDS + 1)
    for parsed, message in updates:
        update = decode_wire(message.payload, Update)
        assert (update.agent_id, update.round) == (parsed.agent_id, parsed.round)
        if update.round == 1:
            assert update.weights and not update.delta  # every family bootstraps in round 1
        elif update.round <= ROUNDS:
            assert update.delta and not update.weights
        else:
            assert update.task == "evaluate" and not update.delta and not update.weights

    # Global states: one family per device class, each decodes with a valid digest.
    states = [decode_wire(m.payload, GlobalState) for parsed, m in seen
              if parsed.kind == "global_state" and m.payload]
    assert {s.family for s in states} == {"cnn_large", "cnn_small", "mlp_tiny"}

    # Retained state a late joiner would get.
    retained = retained_messages(mosquitto.url, f"fl/{FEDERATION}/#")
    announcement = decode_wire(retained[topics.rounds_current], RoundAnnouncement)
    assert (announcement.round, announcement.task) == (ROUNDS + 1, "evaluate")
    status = decode_wire(retained[topics.coordinator_status], CoordinatorStatus)
    assert status.state == "finished"
    assert sorted(t for t in retained if "/global/" in t) == sorted(
        topics.global_state(s.family, ROUNDS + 1) for s in states if s.round == ROUNDS + 1)

    # The coordinator's byte counters agree with the bytes an outside observer saw.
    def wire_bytes(kind: str) -> float:
        return float(sum(len(m.payload) for parsed, m in seen if parsed.kind == kind))

    assert metric(samples, "fl_received_bytes_total", kind="update") == wire_bytes("update")
    assert metric(samples, "fl_sent_bytes_total", kind="global_state") == wire_bytes("global_state")
    assert metric(samples, "fl_sent_bytes_total", kind="round") == wire_bytes("round")
    assert metric(samples, "fl_received_messages_total", kind="update") == len(updates)
    assert metric(samples, "fl_rounds_total", outcome="completed") == ROUNDS + 1
    assert metric(samples, "fl_updates_total", outcome="accepted") == len(updates)

    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == len(agents) for r in rounds)
    assert sum(r["bytes_in"] for r in rounds) == wire_bytes("update")
