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

from coordinator.admission.decisions import Accept, Decision, Defer, Reject
from coordinator.admission.updates import agent_checks
from coordinator.admission.view import AdmissionView
from coordinator.policies.base import RoundPolicy
from coordinator.policies.registry import POLICIES
from coordinator.policies.synchronous import SynchronousPolicy
from coordinator.reasons import RejectReason
from protocol.messages import Update
from protocol.topics import ParsedTopic


class FedBuffPolicy(RoundPolicy):
    name = "async"
    missing_are_stragglers = False  # agents not in a buffer are still training: their work lands in a later one
    defers = True

    def __init__(self, buffer_size: int, max_staleness: int, exponent: float) -> None:
        self.buffer_size = buffer_size
        self.max_staleness = max_staleness
        self.exponent = exponent
        self._evaluation = SynchronousPolicy()
        """The final evaluation round is synchronous: every agent scores the last version once."""

    def oldest_round(self, open_number: int) -> int:
        return open_number - self.max_staleness

    def staleness_weight(self, staleness: int) -> float:
        return float((1 + staleness) ** -self.exponent)

    def selection(self, task: str, fraction: float, minimum: int, over_selection: float) -> tuple[float, int, float]:
        return 1.0, 1, 0.0  # every available agent works; the buffer, not the selection, sets the pace

    def wanted(self, task: str, planned: int) -> int:
        return min(self.buffer_size, planned) if task == "train" else planned

    def decide(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Decision:
        open_round = view.open_round
        if update.task == "evaluate" or (open_round is not None and open_round.announcement.task == "evaluate"):
            return self._evaluation.decide(topic, update, view)
        if open_round is None:  # a buffer is being aggregated, or the next version is about to open
            if update.round >= view.next_round:
                return Reject(RejectReason.NO_OPEN_ROUND, f"round {update.round} is not open")
            # What the next buffer would refuse at once must not take a place in the queue (a replayed update
            # would crowd out its agent's genuine one): judged now as far as can be without the buffer.
            return self._before_buffer(update, view, view.next_round - update.round) or \
                Defer(f"no buffer open; version {view.next_round} is next")
        staleness = open_round.number - update.round
        if staleness < 0:
            return Reject(RejectReason.WRONG_ROUND, f"version {update.round}, newest is {open_round.number}")
        problem = self._before_buffer(update, view, staleness)
        if problem is not None:
            return problem
        buffered = open_round.updates.get(update.agent_id)
        if buffered is not None:
            if buffered.round == update.round:
                return Reject(RejectReason.DUPLICATE, f"already answered version {update.round}")
            return Defer(f"{update.agent_id} is already in this buffer")
        if len(open_round.updates) >= len(open_round.selected):  # the rows hold as many: the next buffer takes it
            return Defer(f"this buffer holds {len(open_round.updates)} updates already")
        problem = agent_checks(update, view) or self._base_problem(update, view, staleness)
        if problem is None:
            problem = (view.payloads.check_update if staleness == 0 else view.payloads.check_delta)(update)
        return problem or Accept(weight=self.staleness_weight(staleness), staleness=staleness)

    def _before_buffer(self, update: Update, view: AdmissionView, staleness: int) -> Reject | None:
        """Why a buffer ``staleness`` versions past the update's would refuse it whatever it holds, or None."""
        if staleness > self.max_staleness:
            return Reject(RejectReason.TOO_STALE, f"trained from version {update.round}, {staleness} behind "
                                                  f"(at most {self.max_staleness})")
        if view.agents.family_of(update.agent_id) is None:
            return Reject(RejectReason.UNKNOWN_AGENT, "no status was ever received from it")
        if view.agents.spent(update.agent_id):  # every available agent is selected: a spent one is not available
            return Reject(RejectReason.UNSELECTED, "its privacy budget is spent (or its ledger went back): it trains "
                                                   "no more")
        applied = view.applied.newest(update.agent_id)
        if applied is not None and update.round <= applied:  # a replay, or a copy of one already in a buffer
            return Reject(RejectReason.DUPLICATE, f"an update of version {applied} was already applied")
        return None

    @staticmethod
    def _base_problem(update: Update, view: AdmissionView, staleness: int) -> Reject | None:
        """A stale update must start from the state its version announced (a current one: checked by the strategy)."""
        if not staleness:
            return None
        expected = view.versions.digest(update.family, update.round)
        if expected is None:  # a bootstrap (weights, not a delta) once the family has a state, or forgotten
            return Reject(RejectReason.STALE_BASE, f"version {update.round} of {update.family} had no "
                                                   f"global state (or it is no longer remembered)")
        if update.base_digest != expected:
            return Reject(RejectReason.STALE_BASE, f"trained from {update.base_digest}, not version "
                                                   f"{update.round}'s {expected}")
        return None


POLICIES.register(
    "async", lambda s: FedBuffPolicy(s.buffer_size, s.max_staleness, s.staleness_exponent),
    summary="buffered asynchronous aggregation (FedBuff): a new global version every buffer_size updates",
    settings=("buffer_size", "max_staleness", "staleness_exponent", "round_deadline_s", "quorum_fraction"))
