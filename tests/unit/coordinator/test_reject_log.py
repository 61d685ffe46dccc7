"""The coordinator's refusal log: every refusal counted; logged once per (sender, reason), and at most a
few senders per reason, so that a fleet-wide refusal does not write a line per device."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from coordinator.telemetry.metrics import CoordinatorMetrics
from coordinator.telemetry.rejects import MAX_SENDERS_PER_REASON, RejectLog


def test_a_fleet_wide_refusal_logs_a_few_senders_then_one_line_and_counts_them_all(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    rejects = RejectLog(CoordinatorMetrics(registry))
    senders = [f"agent-{i:05d}" for i in range(5 * MAX_SENDERS_PER_REASON)]
    with caplog.at_level(logging.WARNING, logger="coordinator.rejects"):
        for _ in range(3):  # three heartbeats each
            for sender in senders:
                rejects.record("agent_status", "registry_full", sender, "50000 agents known")
        rejects.record("update", "bad_signature", "agent-00001", "not its key")
    lines = [r.getMessage() for r in caplog.records]
    full = [line for line in lines if "registry_full" in line]
    assert len(full) == MAX_SENDERS_PER_REASON + 1
    assert all(f"from agent-{i:05d}:" in full[i] for i in range(MAX_SENDERS_PER_REASON))
    assert f"more than {MAX_SENDERS_PER_REASON} senders for registry_full" in full[-1]
    assert [line for line in lines if "bad_signature" in line] == [
        "dropped update from agent-00001: bad_signature: not its key (further ones for this reason are only counted)"]
    counted = registry.get_sample_value("fl_messages_rejected_total", {"kind": "agent_status", "reason": "registry_full"})
    assert counted == 3 * len(senders)
