"""The network thread's gate: with enrollment required, what an unenrolled sender sends costs a lookup and is
dropped before it is queued, counted as the intake would count it; an agent enrolled while the coordinator runs is
let through; with enrollment open everyone is queued."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from coordinator.app.gate import LOGGED_SENDERS, SENDER_BACKLOG, SenderGate, sender_bounds
from coordinator.fleet.enrollment import Enrollment, enroll
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import TrainMetrics, Update
from protocol.security.signing import SigningKey
from protocol.wire import encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, Clock, make_engine
from tests.unit.coordinator.test_enrollment import signed_status

KEYS = {name: SigningKey.generate() for name in ("a", "late", "mallory")}

COUNTED = [("fl_received_bytes_total", {"kind": "agent_status"}), ("fl_received_bytes_total", {"kind": "update"}),
           ("fl_received_messages_total", {"kind": "agent_status"}), ("fl_received_messages_total", {"kind": "update"}),
           ("fl_messages_rejected_total", {"kind": "agent_status", "reason": "unknown_signer"}),
           ("fl_messages_rejected_total", {"kind": "update", "reason": "unknown_signer"}),
           ("fl_messages_rejected_total", {"kind": "unknown", "reason": "bad_topic"}),
           ("fl_updates_total", {"outcome": "rejected"})]


def counts(metrics: CoordinatorMetrics) -> dict[str, float]:
    return {f"{name}{labels}": metrics.registry.get_sample_value(name, labels) or 0.0 for name, labels in COUNTED}


def signed_update(agent_id: str, key: SigningKey) -> bytes:
    update = Update(run_id="r", agent_id=agent_id, round=1, task="train", task_ref=DIGITS, family="f",
                    base_digest=None, num_samples=10, weights={"w": np.ones(3, dtype=np.float32)},
                    metrics=TrainMetrics())
    return encode_message(key.seal(encode_message(update)))


def test_an_unenrolled_sender_is_dropped_before_queueing_and_counted_as_the_intake_counts_it(tmp_path: Path) -> None:
    enroll(tmp_path / "state" / "enrolled.json", "a", KEYS["a"].public_key)
    engine, _, engine_metrics = make_engine(tmp_path, Clock(), enrollment="required")
    gate_metrics = CoordinatorMetrics(CollectorRegistry())
    gate = SenderGate(TOPICS, gate_metrics, engine.parts.enrollment)
    flood = [(TOPICS.agent_status(f"sybil-{i}"), signed_status(f"sybil-{i}", KEYS["mallory"])) for i in range(5)]
    flood += [(TOPICS.update("sybil-9", 1), signed_update("sybil-9", KEYS["mallory"])),
              ("t/agents/not an id/status", b"junk")]
    before = counts(engine_metrics)
    for topic, payload in flood:
        assert gate.admit(topic, payload) is None
        engine.on_message(topic, payload)  # what the loop counted for the same messages before the gate
    engine_counted = {k: v - before[k] for k, v in counts(engine_metrics).items()}
    assert counts(gate_metrics) == engine_counted
    assert counts(gate_metrics)["fl_messages_rejected_total{'kind': 'agent_status', 'reason': 'unknown_signer'}"] == 5
    # An enrolled agent's topic goes on to the signature check, whoever signed it; nothing counted here.
    for payload in (signed_status("a", KEYS["a"]), signed_status("a", KEYS["mallory"])):
        parsed = gate.admit(TOPICS.agent_status("a"), payload)
        assert parsed is not None and (parsed.agent_id, parsed.kind) == ("a", "agent_status")
    parsed = gate.admit(TOPICS.update("a", 3), signed_update("a", KEYS["a"]))
    assert parsed is not None and (parsed.agent_id, parsed.kind) == ("a", "update")
    assert counts(gate_metrics)["fl_received_messages_total{'kind': 'agent_status'}"] == 5


def test_a_cleared_status_passes_and_only_the_first_senders_are_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "enrolled.json"
    enroll(path, "a", KEYS["a"].public_key)
    metrics = CoordinatorMetrics(CollectorRegistry())
    gate = SenderGate(TOPICS, metrics, Enrollment(path))
    # An operator decommissions an agent by clearing its retained status, maybe after un-enrolling it.
    parsed = gate.admit(TOPICS.agent_status("gone"), b"")
    assert parsed is not None and parsed.agent_id == "gone"
    with caplog.at_level(logging.WARNING, logger="coordinator.rejects"):
        for i in range(LOGGED_SENDERS + 50):
            for _ in range(2):
                assert gate.admit(TOPICS.agent_status(f"sybil-{i}"), b"x") is None
    assert metrics.registry.get_sample_value("fl_messages_rejected_total", {
        "kind": "agent_status", "reason": "unknown_signer"}) == 2 * (LOGGED_SENDERS + 50)
    assert len(caplog.records) == LOGGED_SENDERS + 1  # the first of each of the first senders, then one line


def test_an_agent_enrolled_while_running_is_let_through_without_reloading_the_engines_enrollment(
        tmp_path: Path) -> None:
    path = tmp_path / "enrolled.json"
    enroll(path, "a", KEYS["a"].public_key)
    clock = Clock()
    enrollment = Enrollment(path, clock)
    gate = SenderGate(TOPICS, CoordinatorMetrics(CollectorRegistry()), enrollment, clock)
    status = signed_status("late", KEYS["late"])
    assert gate.admit(TOPICS.agent_status("late"), status) is None
    enroll(path, "late", KEYS["late"].public_key)
    clock.now += 0.5
    assert gate.admit(TOPICS.agent_status("late"), status) is None  # the file is looked at once a second at most
    clock.now += 1.0
    assert gate.admit(TOPICS.agent_status("late"), status) is not None
    assert enrollment.get("late") is None  # the engine's thread reloads its own, when the key first signs


def test_with_enrollment_open_every_sender_is_queued(tmp_path: Path) -> None:
    metrics = CoordinatorMetrics(CollectorRegistry())
    gate = SenderGate(TOPICS, metrics, None)
    parsed = gate.admit(TOPICS.agent_status("anyone"), signed_status("anyone", KEYS["mallory"]))
    assert parsed is not None and parsed.agent_id == "anyone"
    assert metrics.registry.get_sample_value("fl_received_messages_total", {"kind": "agent_status"}) is None


def test_over_bound_is_counted_and_bounds_leave_room_for_an_honest_agent(tmp_path: Path) -> None:
    metrics = CoordinatorMetrics(CollectorRegistry())
    gate = SenderGate(TOPICS, metrics, None)
    assert metrics.registry.get_sample_value("fl_messages_rejected_total",
                                             {"kind": "update", "reason": SENDER_BACKLOG}) == 0  # there from the start
    parsed = gate.admit(TOPICS.update("a", 1), b"x" * 10)
    assert parsed is not None
    gate.over_bound(parsed, b"x" * 10, None)
    assert metrics.registry.get_sample_value("fl_messages_rejected_total",
                                             {"kind": "update", "reason": SENDER_BACKLOG}) == 1
    assert metrics.registry.get_sample_value("fl_received_bytes_total", {"kind": "update"}) == 10
    bounds = sender_bounds(max_update_bytes=1 << 20, max_status_bytes=72 * 1024)
    assert bounds["update"].bytes >= 4 * (1 << 20) and bounds["update"].messages >= 4 * (1 << 20) // 4096
    assert bounds["agent_status"].messages == 32 and bounds["agent_status"].bytes == 32 * 72 * 1024
