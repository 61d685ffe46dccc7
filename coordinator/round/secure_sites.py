"""Secure rounds across sites, at the root: the sessions a round gave site aggregators (``SecureSetup.sites``), and
their unmasked sums coming back as secure partials (``PartialAggregate.ring_sum``).

A site aggregator serves its own agents' sessions behind its bridge (``coordinator/sites/secure.py``): their stages
never cross to the root, and the root reads each site's unmasked ring sum back with the same code that reads its
own sessions' (``protocol.secagg.vector.decode_sum``), against the global state it holds, then folds it as one
group. The root learns each site's sum, the site its agents' sum; neither sees one agent's input. A round's
secure part is done when the root's own sessions are unmasked and every site session's partial is in, or at
``setup_deadline``: a site that missed it counts as the stragglers its partial would have named.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from coordinator.admission.decisions import Reject
from coordinator.aggregation import AggregationError
from coordinator.reasons import RejectReason
from coordinator.round.opening import open_round_record
from coordinator.round.secure_plan import prototype_shape
from coordinator.round.secure_session import grouped_sessions, sample_means
from coordinator.state.rounds import OpenRound
from protocol.partials import PartialAggregate
from protocol.secagg.prototype_vector import decode_prototype_sums
from protocol.secagg.vector import decode_sum, quantiser
from protocol.secagg.wire import SecureFamily, SecureSetup

if TYPE_CHECKING:
    from coordinator.round.parts import EngineParts

log = logging.getLogger("coordinator.round.engine")

SiteSession = tuple[str, str]
"""(site id, family)."""


def expected(setup: SecureSetup | None) -> dict[SiteSession, SecureFamily]:
    """The round's site sessions, whose partials the root waits for: per site, one per session, under its first
    family's name (FedProto's one session stands under every family's: ``grouped_sessions``)."""
    if setup is None:
        return {}
    return {(site, family): session for site, held in setup.sites.items()
            for family, (session, _) in grouped_sessions(held.families).items()}


def session_families(setup: SecureSetup | None, site: str, family: str) -> frozenset[str]:
    """The families whose agents a site's partial under ``family`` may name: its session's (FedProto's spans every
    family its agents are of); just ``family`` outside a site session."""
    held = setup.sites.get(site) if setup is not None else None
    found = grouped_sessions(held.families).get(family) if held is not None else None
    return frozenset(found[1]) if found is not None else frozenset({family})


def setup_deadline(open_round: OpenRound) -> float:
    """When the root stops waiting for sites' secure partials: a site closes its masking stage before the round's
    deadline and takes ``unmask_s`` more for the reveals; the bridge gets as long again."""
    secure = open_round.announcement.secure
    return open_round.deadline + 2 * (secure.unmask_s if secure is not None else 0.0)


def secure_sums_in(open_round: OpenRound, at_sites: dict[SiteSession, SecureFamily], now: float,
                   deadline: float) -> bool:
    """Whether every site session's partial arrived (or the wait is over: the missing ones are logged)."""
    missing = sorted(set(at_sites) - open_round.partials)
    if missing and now < deadline:
        return False
    for site, family in missing:
        log.warning("round %d: site %s sent no secure partial for %s: its agents count as stragglers",
                    open_round.number, site, family)
    return True


def released(open_round: OpenRound, at_sites: dict[SiteSession, SecureFamily]) -> list[SecureFamily]:
    """The site sessions whose unmasked sums the root read, folded or not (what distributed DP's ledger accounts:
    a sum refused after reading was still seen)."""
    return [session for key, session in at_sites.items() if key in open_round.decoded_sites]


def account(open_round: OpenRound, at_sites: dict[SiteSession, SecureFamily]) -> dict[str, dict[str, object]]:
    """For ``rounds.jsonl``: per site and family, the session's roster and whether its sum was folded here."""
    return {f"{site}/{family}": {"roster": len(session.roster), "summed": (site, family) in open_round.folded_sites}
            for (site, family), session in sorted(at_sites.items())}


def check_secure_partial(partial: PartialAggregate, session: SecureFamily | None) -> Reject | None:
    """Why a partial of a (site, family) cannot stand for that site's session, or None; reads nothing else.

    Where the round gave the site a session, only a ring sum over exactly its roster is taken (or, when its session
    failed, outcomes alone): a plain partial would bypass the session's weight cap and the ledger, and naming
    agents outside the roster (as stragglers, say) would settle other sites' agents. A sum of fewer survivors
    than the threshold is one no honest site unmasks (the session aborts below it)."""
    if session is None:
        return Reject(RejectReason.BAD_PARTIAL, f"round {partial.round} gave site {partial.site_id} no secure "
                                                f"session of {partial.family}")
    if not partial.secure and (partial.count or partial.sums or partial.proposal):  # none: the session failed
        return Reject(RejectReason.SECURE_ONLY, f"round {partial.round} gave site {partial.site_id} a secure "
                                                f"session of {partial.family}: only its ring sum is taken")
    if set(partial.outcomes) != set(session.roster):
        return Reject(RejectReason.BAD_PARTIAL, "its outcomes do not name exactly its session's roster")
    survivors = sum(o.outcome == "accepted" for o in partial.outcomes.values())
    if partial.count != survivors or 0 < partial.count < session.threshold:
        return Reject(RejectReason.BAD_PARTIAL, f"{partial.count} summands for {survivors} survivors, "
                                                f"threshold {session.threshold}")
    return None


def claimed(parts: EngineParts, agent_id: str) -> int:
    """The samples ``agent_id`` masks its weight by: its status's claim (a site's agents': as the site's roster
    reports it; the session's ``weight_cap``, at most the round's claim cap, bounds what it counts for); 0 for an
    agent not known here. Not its enrolled ``max_samples``: the device masks min(samples, weight_cap) without
    knowing it, and an honest round would be refused."""
    record = parts.registry.get(agent_id)
    return record.status.num_samples if record is not None else 0


def weight_range(parts: EngineParts, survivors: set[str], cap: int) -> tuple[float, float]:
    """(least, most) total weight (session units) honest ``survivors`` mask: at least 1 / cap for each whose status
    reports a sample (an agent with none masks 0), at most min(samples, cap) / cap each (``claimed``)."""
    held = [claimed(parts, agent_id) for agent_id in survivors]
    return sum(1 for n in held if n > 0) / cap, sum(min(n, cap) for n in held) / cap


def most_counted(parts: EngineParts, survivors: set[str], cap: int, classes: int) -> float:
    """FedProto: the most samples (count units) ``survivors`` can count over every class: each at most its claim
    (``claimed``), and at most ``cap`` in each class."""
    return float(sum(min(claimed(parts, agent_id), classes * cap) for agent_id in survivors))


def plausible_sum(sums: Mapping[str, Mapping[str, np.ndarray]], weight: float, weights: tuple[float, float],
                  count: int, setup: SecureSetup, session: SecureFamily) -> str | None:
    """Why unmasked sums of ``count`` survivors weighing ``weight`` (session units; ``weights``: the least and the
    most their statuses allow, ``weight_range``) are larger than their clipped inputs can add up to, or None.

    Each survivor clipped its values to [-clip, clip] (SCAFFOLD's control values to [-control_clip, control_clip])
    and weighed them by w = min(samples, cap) / cap; each rounded by under a step and its weight element too. So
    without noise every summed value is within weight x clip + 2 count steps: a sum that shrinks its weight to
    inflate the mean is caught, and one that grows it past what the survivors' samples allow (one agent masking
    more weight than its claim, to own the mean) too. Under distributed DP the values carry noise, so the L2 norm
    is bounded instead: the weighed L2-clipped deltas, the summed noise to 10 standard deviations past its
    expected norm (a chi tail of e^-50), and the rounding."""
    step = quantiser(setup, session).step
    slack = count * step / setup.clip
    least, most = weights
    if not (math.isfinite(weight) and weight > 0 and least - slack <= weight <= most + slack):
        return f"its sum weighs {weight:.6g}, its survivors at least {least:.6g} and at most {most:.6g}"
    weighed = weight + slack
    for payload, arrays in sums.items():
        values = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in arrays.values()])
        clip = setup.clip if payload == "delta" else setup.control_clip
        assert clip is not None, "a control delta is masked only under a control_clip"
        if setup.noise is None or payload != "delta":  # the noise is on the delta only (vector.encode_input)
            largest = float(np.max(np.abs(values), initial=0.0))
            bound = weighed * clip + 2 * count * step * clip / setup.clip
        else:
            root_d = math.sqrt(values.size)
            largest = float(np.linalg.norm(values))
            bound = (weighed * setup.noise.clip_norm + setup.noise.agent_std * math.sqrt(count) * (root_d + 10)
                     + 2 * count * step * root_d)
        if not largest <= bound:
            return (f"its {payload} sum ({largest:.6g}) exceeds what {count} survivors weighing {weight:.6g} can add up "
                    f"to ({bound:.6g})")
    return None


def plausible_prototypes(sums: np.ndarray, counts: np.ndarray, most: float, count: int, setup: SecureSetup,
                         session: SecureFamily) -> str | None:
    """Why FedProto's unmasked per-class sums and counts (count units) are more than ``count`` survivors can mask,
    or None. Each survivor masked per class w_c = min(count_c, cap) / cap (its counts summing to at most its
    samples: ``most``, in count units, over the survivors) and its prototype row clipped to [-clip, clip] times
    w_c; each value rounded by under a step. So no class counts below 0 nor all together past ``most``, and each
    row's values lie within its count x clip: a device that adds count to one class to own it is caught, as its
    plain update would be (``bad_counts``)."""
    unit = count * quantiser(setup, session).step * session.weight_cap  # rounding, in count x value units
    count_slack = unit / setup.clip
    if not (np.isfinite(counts).all() and np.isfinite(sums).all()):
        return "its prototype sums are not finite"
    if float(counts.min(initial=0.0)) < -count_slack or float(counts.sum()) > most + len(counts) * count_slack:
        return f"its classes count {float(counts.sum()):.6g} samples, its survivors at most {most:.6g}"
    per_class = count * session.weight_cap + count_slack  # each survivor counts at most the cap in any one class
    if float(counts.max(initial=0.0)) > per_class:
        return f"a class counts {float(counts.max()):.6g} samples, {count} survivors at most {per_class:.6g} in one"
    rows = np.abs(sums).max(axis=1, initial=0.0)
    if not (rows <= (np.maximum(counts, 0.0) + count_slack) * setup.clip + unit).all():
        return "a class's prototype sum exceeds its count x clip"
    return None


def fold_secure_partial(parts: EngineParts, open_round: OpenRound, partial: PartialAggregate,
                        members: set[str]) -> Reject | None:
    """A site's unmasked ring sum into the round's folded means, read as the root reads its own sessions' sums;
    why it cannot be, or None. ``check_secure_partial`` has passed."""
    setup = open_round.announcement.secure
    session = expected(setup).get((partial.site_id, partial.family))
    state = parts.strategy.states.get(partial.family)
    assert partial.ring_sum is not None
    prototypes = prototype_shape(parts.settings)
    if setup is None or session is None or (state is None and prototypes is None):
        return Reject(RejectReason.BAD_PARTIAL, f"round {partial.round} gave site {partial.site_id} no secure "
                                                f"session of {partial.family}")
    if not members <= set(session.roster) or partial.ring_sum.shape != (session.n_params,):
        return Reject(RejectReason.BAD_PARTIAL, "its survivors or its ring sum do not fit the session announced")
    if prototypes is not None:
        return _fold_prototype_sums(parts, open_round, partial, members, session, prototypes[0])
    assert state is not None
    control = state.control if setup.control_clip is not None else None
    try:
        sums, weight = decode_sum(partial.ring_sum, partial.count, state.weights, setup, session, control)
    except ValueError as exc:
        return Reject(RejectReason.BAD_PARTIAL, str(exc))
    open_round.decoded_sites.add((partial.site_id, partial.family))
    if setup.noise is not None and len(open_round.decoded_sites) == 1:  # a restart charges the round's release
        parts.actions.add(open_round_record(partial.run_id, open_round, unmasking=True))
    # Each survivor masked a weight of at most min(samples, cap) / cap: a site cannot claim more for its sum.
    implausible = plausible_sum(sums, weight, weight_range(parts, members, session.weight_cap), partial.count, setup,
                                session)
    if implausible is not None:
        return Reject(RejectReason.BAD_PARTIAL, implausible)
    try:
        means = sample_means(sums, weight, partial.count, session.weight_cap, state.weights, control)
    except AggregationError as exc:
        return Reject(RejectReason.BAD_PARTIAL, exc.detail)
    if not parts.strategy.accumulate_sums(partial.family, means, members):
        return Reject(RejectReason.BAD_PARTIAL, f"{parts.strategy.aggregator.describe()} does not fold a mean")
    open_round.folded_sites.add((partial.site_id, partial.family))
    return None


def _fold_prototype_sums(parts: EngineParts, open_round: OpenRound, partial: PartialAggregate, members: set[str],
                         session: SecureFamily, classes: int) -> Reject | None:
    """FedProto: a site session's unmasked per-class sums and counts, checked as the root checks its own session's
    (``plausible_prototypes``), into the strategy beside the other sessions' sums; why they cannot be, or None."""
    setup = open_round.announcement.secure
    assert setup is not None and partial.ring_sum is not None
    try:
        sums, counts = decode_prototype_sums(partial.ring_sum, partial.count, classes, setup, session)
    except ValueError as exc:
        return Reject(RejectReason.BAD_PARTIAL, str(exc))
    open_round.decoded_sites.add((partial.site_id, partial.family))
    most = most_counted(parts, members, session.weight_cap, classes)
    implausible = plausible_prototypes(sums, counts, most, partial.count, setup, session)
    if implausible is not None:
        return Reject(RejectReason.BAD_PARTIAL, implausible)
    try:
        folded = parts.strategy.accumulate_prototype_sums(f"{partial.site_id}/{partial.family}", sums, counts, members)
    except ValueError as exc:
        return Reject(RejectReason.BAD_PARTIAL, str(exc))
    if not folded:
        return Reject(RejectReason.BAD_PARTIAL, f"{parts.strategy.algorithm} does not fold prototype sums")
    open_round.folded_sites.add((partial.site_id, partial.family))
    return None
