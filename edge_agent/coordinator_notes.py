"""What the coordinator tells this agent outside rounds: the run's task card, and refusal notices.

The card (``TaskAnnouncement``, retained) says before round 1 which task the run trains and, per
model family, the layout agents must have; an agent that does not match says so in its status
(``problem``) rather than wait in silence. A notice (``Notice``) says why the coordinator refused
this agent's status or update; the agent logs each reason once and shows the latest in its status.
Both arrive signed by the coordinator's key and pass the agent's freshness check first.
"""

from __future__ import annotations

import logging

from protocol.messages import Notice, TaskAnnouncement, TaskRef

log = logging.getLogger("edge_agent.agent")

MAX_NOTICE_TEXT = 600


class CoordinatorNotes:
    def __init__(self, agent_id: str, task_ref: TaskRef, family: str, layout: str) -> None:
        self.agent_id = agent_id
        self.task_ref = task_ref
        self.family = family
        self.layout = layout
        self.card_problem: str | None = None
        """Why the run's card rules this agent out (another task, another layout), or None."""
        self.notice: str | None = None
        """The latest notice, as ``reason: detail``."""
        self._logged: set[str] = set()

    def on_task(self, announcement: TaskAnnouncement) -> bool:
        """Judge the run's card; whether ``card_problem`` changed."""
        card = announcement.card
        declared = card.layouts.get(self.family)
        problem = None
        if card.ref != self.task_ref:
            problem = f"the run trains task {card.ref}, this agent runs {self.task_ref}"
        elif declared is not None and declared.fingerprint != self.layout:
            problem = (f"its {self.family} model has layout {self.layout}, the run's card declares "
                       f"{declared.fingerprint}")
        if problem == self.card_problem:
            return False
        self.card_problem = problem
        if problem is not None:
            log.warning("the run's task card rules this agent out (task_mismatch): %s", problem)
        else:
            log.info("the run's task card (%s) matches this agent", card.ref)
        return True

    def on_notice(self, notice: Notice) -> bool:
        """Record a notice addressed to this agent; whether it was (False: it names another agent)."""
        if notice.agent_id != self.agent_id:
            return False
        self.notice = f"{notice.reason}: {notice.detail}"[:MAX_NOTICE_TEXT]
        if notice.reason not in self._logged:  # once per reason: a refused agent hears it every interval
            self._logged.add(notice.reason)
            what = f"its update for round {notice.round}" if notice.about == "update" else "its status"
            log.warning("the coordinator refused %s: %s: %s (further notices of this reason are not logged)",
                        what, notice.reason, notice.detail)
        return True
