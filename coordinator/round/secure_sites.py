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
from typing import TYPE_CHECKING

from coordinator.admission.decisions import Reject
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
    """The site sessions whose unmasked sums were taken in (what distributed DP's ledger accounts)."""
    return [session for key, session in at_sites.items() if key in open_round.folded_sites]


def account(open_round: OpenRound, at_sites: dict[SiteSession, SecureFamily]) -> dict[str, dict[str, object]]:
    """For ``rounds.jsonl``: per site and family, the session's roster and whether its sum was folded here."""
    return {f"{site}/{family}": {"roster": len(session.roster), "summed": (site, family) in open_round.folded_sites}
            for (site, family), session in sorted(at_sites.items())}


def fold_secure_partial(parts: EngineParts, open_round: OpenRound, partial: PartialAggregate,
                        members: set[str]) -> Reject | None:
    """A site's unmasked ring sum into the round's folded means, read as the root reads its own sessions' sums;
    why it cannot be, or None."""
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
    # Each survivor masked a weight of at most 1 (min(samples, cap) / cap): a site cannot claim more for its sum.
    if not 0.0 <= weight <= partial.count * (1.0 + 1e-6) + partial.count * quantiser(setup, session).step / setup.clip:
        return Reject(RejectReason.BAD_PARTIAL, f"its sum weighs {weight:.6g}, more than its {partial.count} survivors "
                                                f"can (at most 1 each)")
    means = sample_means(sums, weight, partial.count, session.weight_cap, state.weights, control)
    if not parts.strategy.accumulate_sums(partial.family, means, members):
        return Reject(RejectReason.BAD_PARTIAL, f"{parts.strategy.aggregator.describe()} does not fold a mean")
    open_round.folded_sites.add((partial.site_id, partial.family))
    return None
