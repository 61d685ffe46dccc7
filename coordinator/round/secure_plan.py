"""What a secure round's announcement declares (``RoundAnnouncement.secure``): per family its roster, graph,
threshold, vector length, weight cap and ring, and for the round the grid and the clipping ranges.

A family runs a session in a train round under FedAvg, FedProx and SCAFFOLD once it has a global state (its
bootstrap stays plain: seeded weights, nothing learned from data, beside the other families' sessions); under
FedProto from round 1, since the prototypes' layout is the task's (``num_classes`` x ``embedding_dim``) and
the first prototypes are learned from data already, and in one session across every family (the same
``SecureFamily`` under each family's name). A round with no session is plain. A family with one selected agent, or too few for the
threshold, sits out (its agents' plain updates are refused) and the reason is kept for the round's log.
Under distributed DP (``secagg_noise_multiplier``) the setup declares the noise each agent adds, split for the
smallest threshold, and a grid wide enough for it (``secagg_clip`` gives way to the L2 bound plus the noise). Under
Skellam noise a family whose grid is too coarse for the rounding to stay a small part of the accounted
sensitivity (``SKELLAM_MIN_STEPS``: many summands, or a large model, on a 32-bit ring) sits out.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Iterable, Mapping

from coordinator.fleet.agents import AgentRecord
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.base import FamilyState
from protocol.compression import CompressionSpec
from protocol.messages import RoundAnnouncement
from protocol.secagg.accounting import SKELLAM_MIN_STEPS, skellam_levels
from protocol.secagg.graph import default_degree, default_threshold
from protocol.secagg.prototype_vector import prototype_length
from protocol.secagg.quantise import Quantiser
from protocol.secagg.ring import GRID_LEVELS, ring_bits
from protocol.secagg.vector import vector_length
from protocol.secagg.wire import SecureFamily, SecureNoise, SecureSetup, SiteSessions

log = logging.getLogger("coordinator.round.engine")
NOISE_SIGMAS = 10.0
"""The grid holds an agent's L2-bounded values plus this many standard deviations of its noise. A noisy value past
it is clipped, and the released sum is then not exactly the accounted mechanism: at 10 that happens with
probability 2 Q(10) = 1.5e-23 a value (1.5e-14 over 10^9 values: far under any delta), where 7 gave 2.6e-12
(2.6e-3 over 10^9 values, which a run of many rounds and large models can reach)."""


def prototype_shape(settings: CoordinatorSettings) -> tuple[int, int] | None:
    """FedProto: the (classes, embedding dim) every family's prototypes have (the task card's); else None."""
    if settings.algorithm != "fedproto":
        return None
    card = settings.task_card()
    assert card.embedding_dim is not None  # the settings refuse fedproto on a task without one
    return card.num_classes, card.embedding_dim


def shared_session(families: Iterable[str]) -> str:
    """The name of one session across ``families`` (FedProto's): theirs, joined."""
    return "+".join(sorted(families))


def plan(settings: CoordinatorSettings, states: Mapping[str, FamilyState], announcement: RoundAnnouncement,
         records: Mapping[str, AgentRecord], site_of: Mapping[str, str] | None = None,
         site_key: Callable[[str], bytes | None] = lambda site: None) -> tuple[RoundAnnouncement, list[str]]:
    """(the announcement with its ``secure`` part, or unchanged for a round that stays plain; the families
    that sit out, and why). ``site_of``: the agents behind site aggregators (their sessions are the sites' own,
    ``SecureSetup.sites``, keyed by ``site_key``)."""
    site_of = site_of or {}
    by_family: dict[str, list[str]] = {}
    for agent in announcement.selected:
        by_family.setdefault(records[agent].status.family, []).append(agent)
    prototypes = prototype_shape(settings)
    # A family without a global state bootstraps: its agents send the seeded initial weights, nothing learned from
    # data, in the clear (the policy accepts those alone). The others still run their sessions: a device that
    # claims a new family must not turn the round plain for everyone.
    by_family = {f: agents for f, agents in by_family.items() if prototypes is not None or f in states}
    if announcement.task != "train" or not by_family:
        return announcement, []  # evaluation, or every family bootstraps
    s = settings
    levels = GRID_LEVELS.get(CompressionSpec.parse(s.compression).kind, 0)
    skipped: list[str] = []
    # SCAFFOLD's states carry a server control variate: its agents mask their control delta after the
    # delta, clipped to its own range (gradient units, not weight units: secagg_control_clip).
    controls = {f: (states[f].control or None) if f in states else None for f in by_family}
    # A site's agents form the site's own sessions (its aggregator serves them behind its bridge). FedProto's
    # prototypes share one layout across families (the task's): one session holds every family's agents (at the
    # root, and at each site), so the coordinator learns only the sum over all of them, and a family with one
    # selected agent takes part.
    groups: dict[tuple[str | None, str], list[str]] = {}
    for family, agents in by_family.items():
        for agent in agents:
            groups.setdefault((site_of.get(agent), family if prototypes is None else "*"), []).append(agent)
    names = {key: key[1] if key[1] != "*" else shared_session(
        {records[a].status.family for a in agents}) for key, agents in groups.items()}
    sessions: dict[tuple[str | None, str], SecureFamily] = {}
    for key, agents in sorted(groups.items(), key=lambda item: (item[0][0] or "", item[0][1])):
        where = f"{names[key]}{f' at site {key[0]}' if key[0] else ''}"
        session = _session(s, agents, records, levels, prototypes, states, controls, where, announcement.round,
                           skipped, announcement.claim_cap)
        if session is not None:
            sessions[key] = session
    control_clip = s.secagg_control_clip if any(controls.get(f) for _, f in sessions) else None
    # Normalised prototypes are means of unit vectors: every value lies within 1, a finer grid than the clip's.
    clip = (1.0 if s.proto_normalize else s.secagg_prototype_clip) if prototypes is not None else s.secagg_clip
    noise = None
    if s.secagg_noise_multiplier and sessions:
        # Split for the fewest survivors any family's sum may have; the grid holds the L2-bounded values and the
        # agent's noise to NOISE_SIGMAS of its standard deviation (a value beyond is clipped: ~1e-23 of them).
        noise = SecureNoise(noise_multiplier=s.secagg_noise_multiplier, clip_norm=s.secagg_dp_clip_norm,
                            shares=min(f.threshold for f in sessions.values()), mechanism=s.secagg_noise_mechanism)
        clip = s.secagg_dp_clip_norm + NOISE_SIGMAS * noise.agent_std
        if noise.mechanism == "skellam":
            levels = skellam_levels(noise.agent_std, clip, max(len(f.roster) for f in sessions.values()))
            sessions = {key: f.model_copy(update={"ring_bits": ring_bits(levels, len(f.roster))})
                        for key, f in sessions.items()}
            kept = fine_enough({names[key]: f for key, f in sessions.items()}, clip, levels, noise,
                               announcement.round, skipped)
            sessions = {key: f for key, f in sessions.items() if names[key] in kept}
    families: dict[str, SecureFamily] = {}
    sites: dict[str, dict[str, SecureFamily]] = {}
    for (site, family), session in sessions.items():
        held = families if site is None else sites.setdefault(site, {})
        # FedProto's one session goes under every family's name (agents look theirs up).
        for name in ([family] if family != "*" else sorted({records[a].status.family for a in session.roster})):
            held[name] = session
    setup = SecureSetup(prg=s.secagg_prg, clip=clip, advertise_s=s.secagg_stage_s, share_s=s.secagg_stage_s,
                        unmask_s=s.secagg_stage_s, families=families, levels=levels, control_clip=control_clip,
                        noise=noise, sites={site: SiteSessions(key=site_key(site), families=held)
                                            for site, held in sites.items()})
    # The compression moves into the ring (the grid and ring_bits above): agents mask the quantised
    # delta and send no packed arrays, so the announcement asks for none.
    return announcement.model_copy(update={"secure": setup, "compression": "none"}), skipped


def _session(s: CoordinatorSettings, agents: list[str], records: Mapping[str, AgentRecord], levels: int,
             prototypes: tuple[int, int] | None, states: Mapping[str, FamilyState],
             controls: Mapping[str, Mapping[str, object] | None], where: str, round_number: int,
             skipped: list[str], claim_cap: int | None = None) -> SecureFamily | None:
    """One session of ``agents`` (one family's, or FedProto's across families); None when it sits out (``skipped``
    says why). Its weight cap is the median of its own claims times ``claim_cap_multiple``, and never past the
    round's ``claim_cap`` (the median over every selected agent): a site reports its agents' claims, and must not
    set the cap its own sum is bounded by."""
    n = len(agents)
    degree = max(min(s.secagg_degree or default_degree(max(n, 2)), n - 1), 1)
    degree -= degree % 2 if degree < n - 1 else 0  # below n - 1 a Harary graph needs an even degree
    threshold = s.secagg_threshold or default_threshold(degree)
    if n < 2 or threshold > degree:
        why = ("one selected agent, whose update secure aggregation cannot hide" if n < 2 else
               f"{n} selected agents allow {degree} neighbours each, fewer than secagg_threshold {threshold}")
        skipped.append(f"{where}: {why}")
        log.warning("round %d: %s sits out (its agents' plain updates are refused): %s", round_number, where, why)
        return None
    claims = sorted(records[a].status.num_samples for a in agents)
    cap = min(claims[-1], s.max_samples_per_update)
    if s.claim_cap_multiple:
        cap = min(cap, math.ceil(claims[n // 2] * s.claim_cap_multiple))
    if claim_cap is not None:
        cap = min(cap, claim_cap)
    family = records[agents[0]].status.family
    length = (prototype_length(*prototypes) if prototypes is not None
              else vector_length(states[family].weights, controls[family]))  # type: ignore[arg-type]
    return SecureFamily(roster=sorted(agents), graph_seed=secrets.token_bytes(32), degree=degree, threshold=threshold,
                        n_params=length, weight_cap=max(cap, 1), ring_bits=ring_bits(levels, n) if levels else 32)


def fine_enough(families: dict[str, SecureFamily], clip: float, levels: int, noise: SecureNoise, round_number: int,
                 skipped: list[str]) -> dict[str, SecureFamily]:
    """The families whose grid holds one agent's clip norm in at least SKELLAM_MIN_STEPS x sqrt(d) steps; the others
    sit out (``skipped`` says why). Keeping the noise split for all of them only adds noise."""
    kept = {}
    for family, session in families.items():
        grid = Quantiser(clip, len(session.roster), ring_bits=session.ring_bits, levels=levels)
        steps, needed = grid.scale * noise.clip_norm, SKELLAM_MIN_STEPS * math.sqrt(session.n_params - 1)
        if steps >= needed:
            kept[family] = session
            continue
        why = (f"its grid holds the DP clip norm in {steps:.0f} steps, fewer than the {needed:.0f} Skellam noise needs "
               f"to keep rounding out of the accounted sensitivity ({len(session.roster)} summands of "
               f"{session.n_params - 1} values on a {session.ring_bits}-bit ring)")
        skipped.append(f"{family}: {why}")
        log.warning("round %d: %s sits out (its agents' plain updates are refused): %s", round_number, family, why)
    return kept
