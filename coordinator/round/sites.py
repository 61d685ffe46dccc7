"""A site aggregator's partial aggregate applied at the root: its sums folded, its agents accounted for.

Admission (``coordinator.admission.partials``) decides; this records the decision in the open round.
An accepted partial's sums join the round's folded means as a group of their own
(``Strategy.accumulate_sums``), and each agent it accepted enters the round as answered, with its
sample count and evaluation but no arrays (as a folded update does), so the quorum, the summary, the
federated metrics and ``rounds.jsonl`` count it like an agent that answered the root directly. Agents
the site rejected count as rejected (under the site's reason, when it is one this coordinator knows),
agents it reported straggling as stragglers at the close; either way they cannot answer this round
any more, so a round whose every selected agent is accounted for closes without waiting.
"""

from __future__ import annotations

import logging

import numpy as np

from coordinator.admission.decisions import Reject
from coordinator.admission.partials import PartialIn, admit_partial
from coordinator.aggregation import AggregationError
from coordinator.aggregation.running_mean import RunningMean, l2_norm, layout_key
from coordinator.reasons import RejectReason
from coordinator.round import applying
from coordinator.round.norm_clip import RoundNorms, clipped, control_key
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import HeldSums, RunState
from coordinator.round.secure_sites import check_secure_partial, expected, fold_secure_partial, session_families
from protocol.errors import Reason
from protocol.fields import TaskRef
from protocol.messages import RoundAnnouncement, Task, TrainMetrics, Update
from protocol.partials import PartialAggregate

log = logging.getLogger("coordinator.round.engine")

KNOWN_REASONS = frozenset(r.value for r in RejectReason) | frozenset(r.value for r in Reason)
OTHER_REASON = "site_other"
"""A site's reject reason this coordinator does not know: counted under this label (labels stay bounded)."""


def apply_partial(parts: EngineParts, run: RunState, inbound: PartialIn) -> None:
    partial, site = inbound.partial, inbound.partial.site_id
    view = applying.admission_view(parts, run, parts.clock())
    setup = run.open.announcement.secure if run.open is not None else None
    decision = admit_partial(inbound.topic, partial, view, run.open.partials if run.open is not None else set(),
                             parts.rosters.site_of, session_families(setup, site, partial.family))
    if isinstance(decision, Reject):
        refuse(parts, run, site, decision)
        return
    assert run.open is not None
    accepted = {a: o for a, o in partial.outcomes.items() if o.outcome == "accepted"}
    session = expected(setup).get((site, partial.family))
    held = setup.sites.get(site) if setup is not None else None
    if session is None and held is not None and partial.family in held.families:  # FedProto's, under another name
        refuse(parts, run, site, Reject(RejectReason.SECURE_ONLY, f"round {partial.round} gave site {site} one secure "
                                                                  f"session of {', '.join(sorted(held.families))}: "
                                                                  f"its ring sum goes under the first"))
        return
    if partial.secure or session is not None:  # a site's unmasked SecAgg+ sum: read back against the state held here
        problem = check_secure_partial(partial, session)
        if problem is None and partial.count:
            problem = fold_secure_partial(parts, run.open, partial, set(accepted))
        if problem is not None:
            refuse(parts, run, site, problem)
            return
    elif partial.prototype_sums is not None:  # FedProto's per-class sums
        problem = _fold_prototypes(parts, run.open.announcement, partial,
                                   {a: min(o.samples, view.sample_cap(a)) for a, o in accepted.items()})
        if problem is not None:
            refuse(parts, run, site, problem)
            return
    elif partial.count and not partial.proposal:
        problem = _fold(parts, run, partial, set(accepted))  # weight-0 agents too: folded with no weight, as here
        if problem is not None:
            refuse(parts, run, site, problem)
            return
    elif partial.proposal:  # what the strategy asks of a bootstrap (SCAFFOLD: a control delta named as parameters)
        problem = parts.strategy.check_update(_proposal(partial))
        if problem is not None:
            refuse(parts, run, site, Reject(RejectReason.BAD_PARTIAL, f"its proposal: {problem.detail}"))
            return
    # A training round's accepted agents, every one of weight 0, and no sums: they answered, with nothing to fold.
    weightless = run.open.announcement.task == "train" and not (partial.count or partial.proposal or partial.secure
                                                                 or session is not None)
    open_round, m = run.open, parts.metrics
    open_round.partials.add((site, partial.family))
    open_round.bytes_in += inbound.size
    counts = open_round.sites.setdefault(site, {"accepted": 0, "rejected": 0, "stragglers": 0, "bytes": 0,
                                                "bytes_up": 0})
    counts["bytes"] += partial.bytes_in  # the updates the site took in, which stayed there
    counts["bytes_up"] += inbound.size  # what crossed its bridge instead
    # What the round keeps of each accepted agent: no arrays (folded), but a bootstrap's agreed proposal, shared.
    base = _proposal(partial, open_round.announcement.task, open_round.announcement.task_ref)
    for agent_id, outcome in partial.outcomes.items():
        if outcome.outcome == "accepted" and weightless:
            open_round.settled.add(agent_id)
            parts.applied.record(agent_id, partial.round)
            m.updates.labels("accepted").inc()
            counts["accepted"] += 1
        elif outcome.outcome == "accepted":
            metrics = TrainMetrics.model_construct(eval_accuracy=outcome.eval_accuracy, eval_loss=outcome.eval_loss,
                                                   num_eval_samples=outcome.num_eval_samples)
            # A FedProto session's partial names agents of several families: each counts for its own.
            family = view.agents.family_of(agent_id) or partial.family
            ref = open_round.announcement.states.get(family)
            open_round.updates[agent_id] = base.model_copy(update={
                "agent_id": agent_id, "num_samples": outcome.samples, "metrics": metrics, "family": family,
                "base_digest": base.base_digest if family == partial.family else ref.digest if ref else None})
            parts.applied.record(agent_id, partial.round)
            m.updates.labels("accepted").inc()
            counts["accepted"] += 1
        elif outcome.outcome == "rejected":
            open_round.settled.add(agent_id)
            open_round.rejected += 1
            m.updates.labels("rejected").inc()
            reason = outcome.reason if outcome.reason in KNOWN_REASONS else OTHER_REASON
            parts.rejects.record("update", reason or OTHER_REASON, agent_id, f"at site {site}")
            counts["rejected"] += 1
        else:
            open_round.settled.add(agent_id)
            open_round.site_stragglers.add(agent_id)
            counts["stragglers"] += 1
    log.info("round %d: site %s's %s partial: %d accepted, %d rejected, %d straggling", partial.round, site,
             partial.family, len(accepted), sum(o.outcome == "rejected" for o in partial.outcomes.values()),
             sum(o.outcome == "straggler" for o in partial.outcomes.values()))


def _proposal(partial: PartialAggregate, task: Task = "train", task_ref: TaskRef | None = None) -> Update:
    """An update carrying the partial's bootstrap proposal (empty outside a bootstrap), unvalidated."""
    return Update.model_construct(run_id=partial.run_id, round=partial.round, task=task, task_ref=task_ref,
                                  family=partial.family, base_digest=partial.base_digest, weights=dict(partial.proposal),
                                  control_delta=dict(partial.proposal_control))


def _fold(parts: EngineParts, run: RunState, partial: PartialAggregate, members: set[str]) -> Reject | None:
    """The partial's sums into the round's folded means; why they cannot be, or None."""
    state = parts.strategy.states.get(partial.family)
    if state is None:
        return Reject(RejectReason.BAD_PARTIAL, f"{partial.family} has no global state to add a delta to")
    heaviest = partial.outcomes[partial.heaviest].weight if partial.heaviest is not None else 0.0
    try:
        for name, array in partial.sums.items():
            expected = state.weights.get(name)
            if expected is None or array.shape != expected.shape:
                return Reject(RejectReason.BAD_PARTIAL, f"sum {name} does not match the {partial.family} layout")
        for name, array in partial.integers.items():  # taken as they are: they must be the state's to the dtype
            expected = state.weights.get(name)
            if expected is None or array.shape != expected.shape or array.dtype != expected.dtype:
                return Reject(RejectReason.BAD_PARTIAL, f"integer array {name} is {array.dtype.str}{list(array.shape)}, "
                                                        f"not the {partial.family} layout's")
        heaviest_of = (heaviest, partial.heaviest or "")
        means = {"delta": RunningMean.of_sums(layout_key(state.weights), partial.sums, partial.integers,
                                              partial.total_weight, partial.count, heaviest_of)}
        if state.control or partial.control_sums:  # SCAFFOLD's: laid out as the server variate, or refused
            if {n: a.shape for n, a in partial.control_sums.items()} != {n: a.shape for n, a in state.control.items()}:
                return Reject(RejectReason.BAD_PARTIAL, f"control sums do not match the {partial.family} control "
                                                        f"variate's layout")
            means["control_delta"] = RunningMean.of_sums(layout_key(state.control), partial.control_sums, {},
                                                         partial.total_weight, partial.count, heaviest_of)
    except AggregationError as exc:
        return Reject(RejectReason.BAD_PARTIAL, exc.detail)
    arrays = {"delta": state.weights, "control_delta": state.control}
    for field_name, mean in means.items():  # one pass: not finite, or finite float64 whose mean overflows the state
        for name, total in mean.sums.items():
            largest = float(np.abs(total).max(initial=0.0)) / partial.total_weight
            if not largest <= float(np.finfo(arrays[field_name][name].dtype).max):
                return Reject(RejectReason.BAD_PARTIAL, f"{field_name} {name}'s mean is not finite in "
                                                        f"{arrays[field_name][name].dtype}")
    if parts.strategy.folds is None:
        return Reject(RejectReason.BAD_PARTIAL, f"{parts.strategy.aggregator.describe()} does not fold a mean")
    held = HeldSums(partial.site_id, partial.family, partial.round, means, frozenset(members), partial.total_weight)
    if run.norm_gate.waiting(partial.family):  # the root's own deltas of the family wait for their cohort: the
        run.pending_sums.append(held)  # bound they set is not the round's yet, so the sums wait for the close
        return None
    _place(parts, run, held)
    return None


def _place(parts: EngineParts, run: RunState, held: HeldSums) -> None:
    """Fold ``held`` against the root's bound for one agent's delta; while the root has none, against the sites'."""
    if mean_norm_limit(run.norm_gate.norms, held.family) is not None or run.site_gate.norms.ratio <= 0:
        _fold_held(parts, run, held, None)
        return
    # No bound of the root's own yet (no direct delta this round, none carried): the round's sites' mean norms
    # give one, as agents' norms do (a minority of sites cannot move their median).
    if "control_delta" in held.means:
        run.site_gate.norms.observe(control_key(held.family), _mean_norm(held, "control_delta"))
    for item, bound in run.site_gate.admit(held.family, held, _mean_norm(held, "delta")):
        _fold_held(parts, run, item, bound)


def _fold_prototypes(parts: EngineParts, announcement: RoundAnnouncement, partial: PartialAggregate,
                     counted: dict[str, int]) -> Reject | None:
    """A site's FedProto sums to the strategy; why they cannot be, or None. Shaped as the task's prototypes, in a
    round that is not secure (a secure round's sums come masked, in the site's session: plain ones would stand
    outside it), counting no more samples than its accepted agents may count for here (``counted``: each one's samples, at
    most the round's claim cap), and with a finite float32 mean per class: one lying site moves a class's prototype
    by no more than its agents' capped samples would."""
    sums, counts = partial.prototype_sums, partial.prototype_counts
    assert sums is not None and counts is not None
    if announcement.secure is not None:
        return Reject(RejectReason.BAD_PARTIAL, "prototype sums in the clear in a secure round, whose FedProto "
                                                "sessions send ring sums")
    card = parts.task.card
    if sums.shape != (card.num_classes, card.embedding_dim):
        return Reject(RejectReason.BAD_PARTIAL, f"prototype sums are {list(sums.shape)}, the task's prototypes "
                                                f"[{card.num_classes}, {card.embedding_dim}]")
    samples, total = sum(counted.values()), sum(int(c) for c in counts.tolist())  # Python ints: int64 sums wrap
    if total > samples:
        return Reject(RejectReason.BAD_PARTIAL, f"prototype counts sum to {total}, more than the {samples} samples "
                                                f"its accepted agents count for")
    held = counts > 0
    with np.errstate(all="ignore"):
        largest = float(np.abs(sums[held] / counts[held, None]).max(initial=0.0))
    if not largest <= float(np.finfo(np.float32).max):
        return Reject(RejectReason.BAD_PARTIAL, "its prototypes' mean is not finite in float32")
    if not parts.strategy.accumulate_site_prototypes(sums, counts):
        return Reject(RejectReason.BAD_PARTIAL, f"{parts.strategy.algorithm} takes no prototype sums, or not of this "
                                                f"shape")
    return None


def release_held_sums(parts: EngineParts, run: RunState) -> None:
    """The round closes (the root's own deltas are folded: ``applying.release_held``): fold the sites' sums that
    waited for their bound, then those still held for want of a median, against what arrived."""
    pending, run.pending_sums = run.pending_sums, []
    for held in pending:
        _place(parts, run, held)
    for held, bound in run.site_gate.release():
        _fold_held(parts, run, held, bound)


def _fold_held(parts: EngineParts, run: RunState, held: HeldSums, site_bound: float | None) -> None:
    """``held`` into the round's folds, each mean at most the root's bound for one agent's (or, while the root has
    none, ``site_bound`` from the round's sites)."""
    for field_name, key in (("delta", held.family), ("control_delta", control_key(held.family))):
        if field_name not in held.means:
            continue
        limit = mean_norm_limit(run.norm_gate.norms, key)
        if limit is None and site_bound is not None:
            limit = site_bound if field_name == "delta" else run.site_gate.norms.bound(key)
        if run.norm_gate.norms.ratio > 0 and mean_norm_limit(run.norm_gate.norms, key) is None:
            # No bound of the root's own for this family (all its agents are behind sites): the root's deltas of
            # other families still say how far one may move it, or a lone site's mean would bound itself.
            reference = run.norm_gate.norms.fallback(key)
            if reference is not None:
                scaled = run.norm_gate.norms.ratio * reference
                limit = scaled if limit is None else min(limit, scaled)
        _bound(run, held, field_name, limit)
    folded = parts.strategy.accumulate_sums(held.family, held.means, set(held.members))
    assert folded, "_fold checked that the strategy folds means"


def _mean_norm(held: HeldSums, field_name: str) -> float:
    return l2_norm(held.means[field_name].sums) / held.total_weight


def _bound(run: RunState, held: HeldSums, field_name: str, limit: float | None) -> None:
    """``held``'s mean of ``field_name`` scaled to at most ``limit`` long (the site named in ``clipped_norms``)."""
    if limit is None:
        return
    mean, size = held.means[field_name], _mean_norm(held, field_name)
    mean.sums, was_clipped = clipped(mean.sums, size * held.total_weight, limit * held.total_weight)
    if not was_clipped:
        return
    assert run.open is not None
    if held.site not in run.open.clipped_norms:
        run.open.clipped_norms.append(held.site)
    log.info("round %d: site %s's %s mean %s clipped from norm %.4g to %.4g", held.round, held.site, held.family,
             field_name, size, limit)


def mean_norm_limit(norms: RoundNorms, family: str) -> float | None:
    """How long a site's mean delta of ``family`` may be: the bound a direct delta is clipped to, the larger of this
    round's and the one carried from earlier rounds; None while the root has neither (or clipping is off).

    A mean of deltas the site clipped is no longer than the longest of them, and an honest mean is usually much
    shorter; a site that lies about its sums moves the model no further than one agent of its weight could."""
    if norms.ratio <= 0:
        return None
    bounds = [b for b in (norms.bound(family), norms.ratio * norms.trusted[family] if family in norms.trusted
                          else None) if b is not None]
    return max(bounds) if bounds else None


def refuse(parts: EngineParts, run: RunState, site: str, reject: Reject) -> None:
    """A partial refused whole: none of its agents is counted from it (they may still count as stragglers)."""
    parts.metrics.updates.labels("rejected").inc()
    parts.rejects.record("partial", reject.reason.value, site, reject.detail)
