"""Admitting a site aggregator's partial aggregate at the root: a decoded, signature-checked partial and a view in,
a decision out.

A site enrolls like an agent (its id and public key in the enrollment file) and the intake has already
checked that the site's own key signed it. What is checked here is what the root can check without the
updates: the partial is of this run, of the open training round, started from the state the round
announced for its family, and names only agents the round selected, of that family, bound to this site
(its roster vouched for them, and they have not spoken to the root or another site since), that have not
answered yet, each counted for no more than its cap. One bad entry
refuses the whole partial: its sums cannot be split, and counting part of them twice is worse than not
counting them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from coordinator.admission.decisions import Accept, Reject
from coordinator.admission.view import AdmissionView
from coordinator.reasons import RejectReason
from protocol.partials import PartialAggregate
from protocol.topics import ParsedTopic


@dataclass(frozen=True)
class PartialIn:
    topic: ParsedTopic
    partial: PartialAggregate
    size: int
    """Bytes on the wire."""


def admit_partial(topic: ParsedTopic, partial: PartialAggregate, view: AdmissionView,
                  taken: set[tuple[str, str]], site_of: Mapping[str, str],
                  families: Collection[str] | None = None) -> Accept | Reject:
    """``taken``: the (site, family) pairs whose partial the open round already holds; ``site_of``: agent -> the
    site it is bound to (``RosterOrder.site_of``); ``families``: those whose agents the partial may name (a secure
    FedProto session's spans several; default: its own). Changes nothing."""
    if partial.site_id != topic.agent_id or partial.round != topic.round:
        return Reject(RejectReason.TOPIC_MISMATCH,
                      f"partial of {partial.site_id}/{partial.round} on {topic.agent_id}/{topic.round}")
    if partial.run_id != view.run_id:
        return Reject(RejectReason.WRONG_RUN, f"run {partial.run_id}, expected {view.run_id}")
    open_round = view.open_round
    if open_round is None or partial.round != open_round.number:
        if partial.round < view.next_round:
            return Reject(RejectReason.LATE, f"round {partial.round} is closed")
        return Reject(RejectReason.NO_OPEN_ROUND, f"round {partial.round} is not open")
    announcement = open_round.announcement
    if announcement.task != "train" and (partial.count or partial.proposal):
        return Reject(RejectReason.BAD_PARTIAL, f"payload in an answer to a {announcement.task} round")
    if (partial.site_id, partial.family) in taken:
        return Reject(RejectReason.DUPLICATE, f"site {partial.site_id} already sent {partial.family} of this round")
    state = announcement.states.get(partial.family)
    if partial.proposal and state is not None:
        return Reject(RejectReason.STALE_BASE, f"a bootstrap proposal for {partial.family}, which has a state")
    if not partial.proposal and (state is None) != (partial.base_digest is None) or (
            state is not None and state.digest != partial.base_digest):
        return Reject(RejectReason.STALE_BASE, f"{partial.family} from {partial.base_digest}, "
                                               f"the round started from {state.digest if state else 'no state'}")
    for agent_id, outcome in partial.outcomes.items():
        if agent_id not in open_round.selected_set:
            return Reject(RejectReason.UNSELECTED, f"{agent_id} was not selected for round {partial.round}")
        if site_of.get(agent_id) != partial.site_id:  # else a site could settle (or void) agents it does not hold
            holder = site_of.get(agent_id)
            where = f"held by site {holder}" if holder else "held by no site"
            return Reject(RejectReason.HELD_ELSEWHERE, f"{agent_id} is {where}, not {partial.site_id}")
        if agent_id in open_round.updates or agent_id in open_round.settled:
            return Reject(RejectReason.DUPLICATE, f"{agent_id} already answered round {partial.round}")
        family = view.agents.family_of(agent_id)
        if family is not None and family not in (families or (partial.family,)):
            return Reject(RejectReason.WRONG_FAMILY, f"{agent_id} is of {family}, the partial of {partial.family}")
        hard, cap = hard_cap(view, agent_id), view.sample_cap(agent_id)
        if outcome.outcome == "accepted" and (outcome.samples > hard or outcome.weight > min(cap, outcome.samples)):
            return Reject(RejectReason.BAD_PARTIAL, f"{agent_id} counted for {outcome.weight} "
                                                    f"({outcome.samples} samples), its cap is {cap}")
    return Accept()


def hard_cap(view: AdmissionView, agent_id: str) -> int:
    """The most samples an agent may claim, whoever folded it: its enrolled cap, else ``max_samples``. What it
    may count for is ``view.sample_cap``: the round announced the median-based cap, and sites apply it too."""
    own = view.enrolled.max_samples_of(agent_id) if view.enrolled is not None else None
    return min(view.max_samples, own) if own else view.max_samples
