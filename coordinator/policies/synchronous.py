"""Synchronous rounds: announce, collect until the wanted number answered or the deadline, close."""

from __future__ import annotations

from coordinator.admission.decisions import Accept, Decision, Reject
from coordinator.admission.updates import agent_checks
from coordinator.admission.view import AdmissionView
from coordinator.policies.base import RoundPolicy
from coordinator.policies.registry import POLICIES
from coordinator.reasons import RejectReason
from protocol.messages import Update
from protocol.topics import ParsedTopic


class SynchronousPolicy(RoundPolicy):
    name = "sync"

    def decide(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Decision:
        open_round = view.open_round
        if open_round is None or update.round < open_round.number:
            if update.round < view.next_round:
                return Reject(RejectReason.LATE, f"round {update.round} is closed")
            return Reject(RejectReason.NO_OPEN_ROUND, f"round {update.round} is not open")
        if update.round != open_round.number:
            return Reject(RejectReason.WRONG_ROUND, f"round {update.round}, open is {open_round.number}")
        if update.agent_id not in open_round.selected_set:
            if view.agents.family_of(update.agent_id) is None:
                return Reject(RejectReason.UNKNOWN_AGENT, "no status was ever received from it")
            return Reject(RejectReason.UNSELECTED, f"not selected for round {update.round}")
        if update.agent_id in open_round.updates:
            return Reject(RejectReason.DUPLICATE, f"already answered round {update.round}")
        if update.task != open_round.announcement.task:
            return Reject(RejectReason.WRONG_TASK, f"{update.task} answer to a {open_round.announcement.task} round")
        problem = agent_checks(update, view)
        if problem is None and update.task == "train":
            problem = view.payloads.check_update(update)
        return problem or Accept()


POLICIES.register("sync", lambda settings: SynchronousPolicy(), summary=(
    "synchronous rounds: select, collect until the wanted number answered or the deadline, aggregate"),
    settings=("fraction_fit", "min_fit_agents", "over_selection", "round_deadline_s", "quorum_fraction"))
