"""Telling an agent why it was refused, and spotting two live processes under one agent id.

Called by ``applying`` for messages whose sender was authenticated (intake's refusals never earn a
notice): the notice is signed, sent on the agent's own topic, and rate-limited (``NoticeLimiter``).
"""

from __future__ import annotations

import logging

from coordinator.admission.decisions import Reject
from coordinator.fleet.notices import NOT_NOTIFIED
from coordinator.reasons import RejectReason
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState
from protocol.messages import AgentStatus, Notice

log = logging.getLogger("coordinator.round.engine")


def notify(parts: EngineParts, run: RunState, agent_id: str, about: str, reject: Reject, round_number: int = 0,
           *, limit_key: str | None = None) -> bool:
    """Send ``agent_id`` a notice of ``reject`` unless its reason says nothing to the agent or one went lately
    (per agent and ``limit_key``, the reason by default)."""
    reason = reject.reason.value
    if reject.reason in NOT_NOTIFIED or not parts.notices.allow(agent_id, limit_key or reason, parts.clock()):
        return False
    parts.publisher.notice(Notice(run_id=run.run_id or "none", agent_id=agent_id, about=about,  # type: ignore[arg-type]
                                  reason=reason, detail=reject.detail[:512], round=round_number,
                                  timestamp=parts.wall_clock(), epoch=run.epoch))
    parts.metrics.notices_sent.labels(reason).inc()
    return True


def watch_duplicates(parts: EngineParts, run: RunState, status: AgentStatus) -> None:
    """Before ``status`` is recorded (or refused as stale): does it show a second live process of its agent?"""
    record = parts.registry.get(status.agent_id)
    newest = None if record is None else (record.status.session, record.status.epoch)
    duplicates, agent_id = parts.duplicates, status.agent_id
    why = duplicates.check(agent_id, status.session, status.epoch, status.seq, newest)
    if why is not None:
        parts.metrics.duplicate_agent_ids.inc()
        detail = f"two live processes use agent id {agent_id}: {why}; give each device its own id"
        if parts.notices.allow(agent_id, "duplicate_agent_id:log", parts.clock()):
            log.warning("%s", detail)  # once per agent per notice interval
        duplicates.owe(agent_id, tuple(s for s in (status.session, newest and newest[0]) if s), detail)
    owed = duplicates.owed(agent_id, status.session)
    if owed is not None and status.session is not None and notify(  # it just published: it is the one connected
            parts, run, agent_id, "status", Reject(RejectReason.DUPLICATE_AGENT_ID, owed),
            limit_key=f"duplicate_agent_id:{status.session}"):
        duplicates.told(agent_id, status.session)
