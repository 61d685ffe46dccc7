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
from coordinator.round.secure_session import sample_means
from coordinator.state.rounds import OpenRound
from protocol.partials import PartialAggregate
from protocol.secagg.vector import decode_sum, quantiser
from protocol.secagg.wire import SecureFamily, SecureSetup

if TYPE_CHECKING:
    from coordinator.round.parts import EngineParts

log = logging.getLogger("coordinator.round.engine")

SiteSession = tuple[str, str]
"""(site id, family)."""


def expected(setup: SecureSetup | None) -> dict[SiteSession, SecureFamily]:
    """The round's site sessions, whose partials the root waits for."""
    if setup is None:
        return {}
    return {(site, family): session for site, held in setup.sites.items() for family, session in held.families.items()}


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


def least_weight(parts: EngineParts, survivors: set[str], cap: int) -> float:
    """The least total weight (session units) honest ``survivors`` mask: 1 / cap for each whose status reports a
    sample (an agent with none masks 0)."""
    def samples(agent_id: str) -> int:
        record = parts.registry.get(agent_id)
        return record.status.num_samples if record is not None else 0
    return sum(1 for agent_id in survivors if samples(agent_id) > 0) / cap


def plausible_sum(delta: Mapping[str, np.ndarray], weight: float, least: float, count: int, setup: SecureSetup,
                  session: SecureFamily) -> str | None:
    """Why unmasked delta sums of ``count`` survivors weighing ``weight`` (session units, at least ``least``) are
    larger than their clipped inputs can add up to, or None.

    Each survivor clipped its values to [-clip, clip] and weighed them by w <= 1; each rounded by under a step
    and its weight element too. So without noise every summed value is within weight x clip + 2 count steps:
    a site that shrinks the weight to inflate the mean is caught. Under distributed DP the values carry noise,
    so the L2 norm is bounded instead: the weighed L2-clipped deltas, the summed noise to 10 standard deviations
    past its expected norm (a chi tail of e^-50), and the rounding; there the noise divided by a shrunk weight
    would inflate the mean, so the weight may not fall under what the survivors' statuses make ``least``."""
    step = quantiser(setup, session).step
    if not (math.isfinite(weight) and weight > 0 and weight >= least - count * step / setup.clip):
        return f"its sum weighs {weight:.6g}, its survivors at least {least:.6g}"
    values = np.concatenate([np.asarray(a, np.float64).reshape(-1) for a in delta.values()])
    weighed = weight + count * step / setup.clip
    if setup.noise is None:
        largest = float(np.max(np.abs(values), initial=0.0))
        bound = weighed * setup.clip + 2 * count * step
    else:
        root_d = math.sqrt(values.size)
        largest = float(np.linalg.norm(values))
        bound = (weighed * setup.noise.clip_norm + setup.noise.agent_std * math.sqrt(count) * (root_d + 10)
                 + 2 * count * step * root_d)
    if not largest <= bound:
        return f"its sum ({largest:.6g}) exceeds what {count} survivors weighing {weight:.6g} can add up to ({bound:.6g})"
    return None


def fold_secure_partial(parts: EngineParts, open_round: OpenRound, partial: PartialAggregate,
                        members: set[str]) -> Reject | None:
    """A site's unmasked ring sum into the round's folded means, read as the root reads its own sessions' sums;
    why it cannot be, or None. ``check_secure_partial`` has passed."""
    setup = open_round.announcement.secure
    held = setup.sites.get(partial.site_id) if setup is not None else None
    session = held.families.get(partial.family) if held is not None else None
    state = parts.strategy.states.get(partial.family)
    assert partial.ring_sum is not None
    if setup is None or session is None or state is None:
        return Reject(RejectReason.BAD_PARTIAL, f"round {partial.round} gave site {partial.site_id} no secure "
                                                f"session of {partial.family}")
    if not members <= set(session.roster) or partial.ring_sum.shape != (session.n_params,):
        return Reject(RejectReason.BAD_PARTIAL, "its survivors or its ring sum do not fit the session announced")
    control = state.control if setup.control_clip is not None else None
    try:
        sums, weight = decode_sum(partial.ring_sum, partial.count, state.weights, setup, session, control)
    except ValueError as exc:
        return Reject(RejectReason.BAD_PARTIAL, str(exc))
    open_round.decoded_sites.add((partial.site_id, partial.family))
    # Each survivor masked a weight of at most 1 (min(samples, cap) / cap): a site cannot claim more for its sum.
    if not weight <= partial.count * (1.0 + 1e-6) + partial.count * quantiser(setup, session).step / setup.clip:
        return Reject(RejectReason.BAD_PARTIAL, f"its sum weighs {weight:.6g}, more than its {partial.count} survivors "
                                                f"can (at most 1 each)")
    implausible = plausible_sum(sums["delta"], weight, least_weight(parts, members, session.weight_cap),
                                partial.count, setup, session)
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
