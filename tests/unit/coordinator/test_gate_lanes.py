"""Every lane the coordinator subscribes to is bounded per sender in its inbox (found in review: partials, rosters
and secure-aggregation stages were not, so one enrolled site could fill the inbox), and the cleared statuses of ids
not enrolled, which anyone may publish, queue under one shared sender. The service's path (coordinator/app/service.py
``_received``): the gate admits, the inbox queues under the gate's sender, or refuses and the gate counts it."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator.app.gate import SenderGate, sender_bounds
from coordinator.app.inbox import FairInbox
from coordinator.app.service import INBOX_BYTES
from coordinator.fleet.enrollment import Enrollment, enroll
from coordinator.settings import CoordinatorSettings
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.security.signing import SigningKey
from tests.unit.coordinator.test_engine import TOPICS

FLOOD = 100_000


def service_like(tmp_path: Path) -> tuple[SenderGate, FairInbox]:
    path = tmp_path / "enrolled.json"
    for name in ("a", "site"):
        enroll(path, name, SigningKey.generate().public_key)
    settings = CoordinatorSettings(federation="t", state_dir=tmp_path / "state")
    gate = SenderGate(TOPICS, CoordinatorMetrics(CollectorRegistry()), Enrollment(path))
    return gate, FairInbox(INBOX_BYTES, sender_bounds(settings.max_update_bytes, 64 * 1024))


def received(gate: SenderGate, inbox: FairInbox, topic: str, payload: bytes) -> bool:
    parsed = gate.admit(topic, payload)
    if parsed is None:
        return False
    queued = inbox.put(("message", topic, payload), len(payload), sender=gate.sender_of(parsed, payload),
                       lane=parsed.kind)
    if not queued:
        gate.over_bound(parsed, payload, inbox.bounds.get(parsed.kind))
    return queued


def an_honest_update_gets_queued(gate: SenderGate, inbox: FairInbox) -> bool:
    """The inbox has room for it (a full one would make the network thread wait), and it is queued."""
    assert inbox.queued_messages < inbox.max_messages and inbox.queued_bytes + 1000 <= inbox.max_bytes
    return received(gate, inbox, TOPICS.update("a", 1), b"x" * 1000)


@pytest.mark.parametrize("topic", [TOPICS.partial("site", 1), TOPICS.site_roster("site"),
                                   TOPICS.secagg("site", 1, "masked")])
def test_one_enrolled_sender_flooding_any_lane_is_cut_off(tmp_path: Path, topic: str) -> None:
    gate, inbox = service_like(tmp_path)
    queued = sum(received(gate, inbox, topic, b"p" * 8) for _ in range(FLOOD))
    assert queued <= 128
    assert an_honest_update_gets_queued(gate, inbox)
    inbox.close()


def test_cleared_statuses_of_made_up_ids_queue_under_one_sender(tmp_path: Path) -> None:
    gate, inbox = service_like(tmp_path)
    queued = sum(received(gate, inbox, TOPICS.agent_status(f"sybil-{i}"), b"") for i in range(FLOOD))
    assert queued == 32  # STATUS_BACKLOG, shared by them all
    assert received(gate, inbox, TOPICS.agent_status("a"), b"")  # an enrolled agent's own clear is its own
    assert an_honest_update_gets_queued(gate, inbox)
    inbox.close()
