"""Synchronous rounds: announce, collect until the wanted number answered or the deadline, close."""

from __future__ import annotations

from coordinator.policies.base import Admission, AdmissionView, RoundPolicy, agent_checks, common_checks
from coordinator.reasons import RejectedUpdate, RejectReason
from protocol.messages import Update
from protocol.topics import ParsedTopic


class SynchronousPolicy(RoundPolicy):
    name = "sync"

    def admit(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Admission:
        common_checks(topic, update, view)
        open_round = view.open_round
        if open_round is None or update.round < open_round.number:
            if update.round < view.next_round:
                raise RejectedUpdate(RejectReason.LATE, f"round {update.round} is closed")
            raise RejectedUpdate(RejectReason.NO_OPEN_ROUND, f"round {update.round} is not open")
        if update.round != open_round.number:
            raise RejectedUpdate(RejectReason.WRONG_ROUND, f"round {update.round}, open is {open_round.number}")
        if update.agent_id not in open_round.selected_set:
            if view.family_of(update.agent_id) is None:
                raise RejectedUpdate(RejectReason.UNKNOWN_AGENT, "no status was ever received from it")
            raise RejectedUpdate(RejectReason.UNSELECTED, f"not selected for round {update.round}")
        if update.agent_id in open_round.updates:
            raise RejectedUpdate(RejectReason.DUPLICATE, f"already answered round {update.round}")
        if update.task != open_round.announcement.task:
            raise RejectedUpdate(RejectReason.WRONG_TASK, f"{update.task} answer to a {open_round.announcement.task} round")
        agent_checks(update, view)
        view.check_task(update)
        if update.task == "train":
            view.check_payload(update, True)
        return Admission()
