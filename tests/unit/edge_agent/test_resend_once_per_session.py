"""An agent sends its update again when a new coordinator session announces the round it answered (the coordinator
may have lost it), once per session: a signed status verifies whatever its age, so replaying two sessions'
statuses alternately made it upload the update every time (found in review of the sites' same rule)."""

from __future__ import annotations

from pathlib import Path

from edge_agent.pending import SentUpdate
from protocol.messages import CoordinatorStatus
from tests.unit.edge_agent.test_agent_faults import TOPICS
from tests.unit.edge_agent.test_freshness import B, make_agent, signed
from tests.unit.edge_agent.test_receiver_attacks import round_bytes


def status(session: str) -> bytes:
    return signed(CoordinatorStatus(federation="t", run_id=B[0], session=session, state="online", round=2,
                                    algorithm="fedavg", version="t", timestamp=0.0, epoch=B[1]))


def test_the_update_goes_again_once_to_each_new_session(tmp_path: Path) -> None:
    agent, _, link = make_agent(tmp_path)
    agent._on_message(TOPICS.coordinator_status, status("s0"), True)
    agent.outbox.sent = SentUpdate(B[0], 2, [b"the update"], {"s0"})  # round 2 answered under session s0
    announcement = round_bytes(B, 2)
    agent._on_message(TOPICS.rounds_current, announcement, True)
    assert link.updates() == []  # the same session: nothing to resend
    agent._on_message(TOPICS.coordinator_status, status("s1"), True)  # the coordinator restarted
    agent._on_message(TOPICS.rounds_current, announcement, True)
    assert link.updates() == [TOPICS.update("me", 2)]
    for _ in range(3):  # anyone replays both sessions' genuine statuses, with the announcement
        for session in ("s0", "s1"):
            agent._on_message(TOPICS.coordinator_status, status(session), True)
            agent._on_message(TOPICS.rounds_current, announcement, True)
    assert link.updates() == [TOPICS.update("me", 2)]
