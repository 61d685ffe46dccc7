"""Buffered asynchronous aggregation (FedBuff, Nguyen et al. 2022).

Each training "round" is a global version. Every available agent is selected; an agent trains
whenever it is free, from the newest version it has, and its update is folded into the open
buffer whatever version it started from, as long as that is at most ``max_staleness`` versions
old (older: dropped as ``too_stale``). The buffer closes into the next version once
``buffer_size`` updates are in, or at the deadline with at least the quorum.

An update ``s`` versions stale weighs ``(1 + s) ** -exponent`` times its sample count;
exponent 0.5 is FedBuff's ``1/sqrt(1 + s)``: it discounts stale work smoothly rather than
dropping it, which is what lets slow devices still count. The weighted mean is normalised,
so the discount is relative to the buffer's other updates; ``server_learning_rate`` scales the
step. A second update of an agent already in the buffer (it finished a stale version, then the
current one) waits for the next buffer (``Defer``), as do updates arriving while a buffer is
being aggregated: finished work is not thrown away.
"""

from __future__ import annotations

from coordinator.policies.base import Admission, AdmissionView, Defer, RoundPolicy, agent_checks, common_checks
from coordinator.policies.synchronous import SynchronousPolicy
from coordinator.reasons import RejectedUpdate, RejectReason
from protocol.messages import Update
from protocol.topics import ParsedTopic


class FedBuffPolicy(RoundPolicy):
    name = "async"
    missing_are_stragglers = False  # agents not in a buffer are still training: their work lands in a later one

    def __init__(self, buffer_size: int, max_staleness: int, exponent: float) -> None:
        self.buffer_size = buffer_size
        self.max_staleness = max_staleness
        self.exponent = exponent
        self._evaluation = SynchronousPolicy()
        """The final evaluation round is synchronous: every agent scores the last version once."""

    def staleness_weight(self, staleness: int) -> float:
        return float((1 + staleness) ** -self.exponent)

    def selection(self, task: str, fraction: float, minimum: int, over_selection: float) -> tuple[float, int, float]:
        return 1.0, 1, 0.0  # every available agent works; the buffer, not the selection, sets the pace

    def wanted(self, task: str, planned: int) -> int:
        return min(self.buffer_size, planned) if task == "train" else planned

    def admit(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Admission:
        open_round = view.open_round
        if update.task == "evaluate" or (open_round is not None and open_round.announcement.task == "evaluate"):
            return self._evaluation.admit(topic, update, view)
        common_checks(topic, update, view)
        if open_round is None:  # a buffer is being aggregated, or the next version is about to open
            if update.round < view.next_round:
                raise Defer(f"no buffer open; version {view.next_round} is next")
            raise RejectedUpdate(RejectReason.NO_OPEN_ROUND, f"round {update.round} is not open")
        staleness = open_round.number - update.round
        if staleness < 0:
            raise RejectedUpdate(RejectReason.WRONG_ROUND, f"version {update.round}, newest is {open_round.number}")
        if staleness > self.max_staleness:
            raise RejectedUpdate(RejectReason.TOO_STALE, f"trained from version {update.round}, {staleness} behind "
                                                         f"(at most {self.max_staleness})")
        if view.family_of(update.agent_id) is None:
            raise RejectedUpdate(RejectReason.UNKNOWN_AGENT, "no status was ever received from it")
        buffered = open_round.updates.get(update.agent_id)
        if buffered is not None:
            if buffered.round == update.round:
                raise RejectedUpdate(RejectReason.DUPLICATE, f"already answered version {update.round}")
            raise Defer(f"{update.agent_id} is already in this buffer")
        agent_checks(update, view)
        view.check_task(update)
        if staleness:
            expected = view.version_digest(update.family, update.round)
            if expected is None:  # a bootstrap (weights, not a delta) once the family has a state, or forgotten
                raise RejectedUpdate(RejectReason.STALE_BASE, f"version {update.round} of {update.family} had no "
                                                              f"global state (or it is no longer remembered)")
            if update.base_digest != expected:
                raise RejectedUpdate(RejectReason.STALE_BASE, f"trained from {update.base_digest}, not version "
                                                              f"{update.round}'s {expected}")
        view.check_payload(update, staleness == 0)
        return Admission(staleness, self.staleness_weight(staleness))
