"""A site aggregator's side of secure rounds: the SecAgg+ sessions the root's announcement gives its site
(``SecureSetup.sites``), served for its own agents on its own broker.

Its agents' stages (``secagg/{agent}/{round}/{stage}``) never cross the bridge. The site relays for them as the root
does for its own sessions (``coordinator/round/secure.py``), every relay signed with its key, which the root's signed
announcement names, so agents take the site's relays and nobody else's: keys once advertising closes (``advertise_s``
after the announcement was issued), each agent's bundles once sharing closes (``share_s`` more), the survivors at
the site's own deadline, the unmasked sum once every survivor revealed (or ``unmask_s`` later). Then one
secure partial per session goes up the bridge with the unmasked ring sum (``PartialAggregate.ring_sum``), which the
root reads back against the global state it holds (under FedProto one session holds every family's agents, relayed
on each family's topics, and its partial goes up under its first family's name: ``grouped_sessions``): the site
learns its agents' sum, the root each site's sum, neither one agent's input. Survivors are accepted (without a weight: the site knows only the total), the rest of
the roster stragglers; a session that aborts sends its agents as rejected (``secagg_refused``) with no sum.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.reasons import RejectReason
from coordinator.round.secure_session import STAGES, grouped_sessions, take_stage
from protocol.messages import RoundAnnouncement, TrainMetrics
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted, SecAggRefused
from protocol.secagg.server import SecAggServer
from protocol.secagg.vector import quantiser
from protocol.secagg.wire import AdvertisedKeys, SecureFamily, SecureInbox, SecureKeys, SecureUnmask, SiteSessions
from protocol.topics import Topics

log = logging.getLogger(__name__)

Relay = tuple[str, Any]
"""(topic, message) for the site's broker, to be signed with the site's key."""


@dataclass
class SiteSession:
    family: str
    """The session's name: its family's, or under FedProto the first of its families' (its partial goes up as that)."""
    setup: SecureFamily
    server: SecAggServer
    relays: tuple[str, ...]
    """The families whose relay topics carry its keys and unmasking request (under FedProto, several)."""
    members: dict[str, set[str]] = field(default_factory=lambda: {s: set() for s in STAGES})
    metrics: dict[str, TrainMetrics] = field(default_factory=dict)
    total: np.ndarray | None = None
    """The unmasked ring sum, once the reveals are in."""
    failure: str | None = None


class SiteSecureRound:
    def __init__(self, announcement: RoundAnnouncement, held: SiteSessions, topics: Topics, now: float,
                 issued_age: float, masked_by: float) -> None:
        """``issued_age``: seconds since the root issued the announcement; ``masked_by``: the site's deadline."""
        assert announcement.secure is not None
        self.announcement, self.setup, self.topics = announcement, announcement.secure, topics
        self.sessions: dict[str, SiteSession] = {}
        for family, (fam, relays) in grouped_sessions(held.families).items():
            config = RoundConfig(announcement.round, tuple(fam.roster), fam.n_params, fam.graph_seed, fam.degree,
                                 fam.threshold, self.setup.prg)
            self.sessions[family] = SiteSession(family, fam, SecAggServer(config), relays)
        self.family_of = {agent: family for family, session in self.sessions.items() for agent in session.setup.roster}
        """Agent -> the name of its session."""
        opened = now - issued_age
        self.stage = "advertise"
        self.deadline = opened + self.setup.advertise_s
        self._next = {"share": opened + self.setup.advertise_s + self.setup.share_s, "mask": masked_by}
        """Deadlines of the stages that follow, by stage (the reveals get ``unmask_s`` once the survivors are out)."""

    @property
    def done(self) -> bool:
        return self.stage == "done"

    def receive(self, agent: str, stage: str, message: Any) -> None:
        """One of its agents' stage messages (admitted: signed by the agent, of this run and round); raises
        SecAggRefused for one the session cannot take (late, out of order, not in its roster)."""
        session = self.sessions.get(self.family_of.get(agent, ""))
        if session is None:
            raise SecAggRefused(f"{agent} is not in a secure session of this site")
        if stage != self.stage:
            raise SecAggRefused(f"a {stage} message while the site's session is at {self.stage}")
        take_stage(session.server, session.setup, session.relays, agent, stage, message, session.metrics)
        session.members[stage].add(agent)

    def advance(self, now: float) -> list[Relay]:
        """Close the open stage when every live session's agents answered or at its deadline: what to relay."""
        live = [s for s in self.sessions.values() if s.failure is None]
        if self.done:
            return []
        previous = {"advertise": lambda s: set(s.setup.roster), "share": lambda s: s.members["advertise"],
                    "mask": lambda s: s.members["share"], "unmask": lambda s: s.members["mask"]}[self.stage]
        if now < self.deadline and not all(s.members[self.stage] >= previous(s) for s in live):
            return []
        out: list[Relay] = []
        for session in live:
            try:
                out += self._close(session)
            except SecAggAborted as exc:
                session.failure = str(exc)
                log.warning("round %d: the site's %s session failed: %s", self.announcement.round, session.family, exc)
        following = STAGES.index(self.stage) + 1
        self.stage = STAGES[following] if following < len(STAGES) else "done"
        self.deadline = self._next.get(self.stage, now + self.setup.unmask_s)
        return out

    def _close(self, session: SiteSession) -> list[Relay]:
        ann, server, family = self.announcement, session.server, session.family
        if self.stage == "advertise":
            server.close_advertising()
            ads = [AdvertisedKeys(agent_id=a.agent, encryption_key=a.encryption_key, mask_key=a.mask_key,
                                  commitment=a.self_mask_commitment) for _, a in sorted(server.advertised.items())]
            return [(self.topics.secagg_relay(relay, ann.round, "keys"),
                     SecureKeys(run_id=ann.run_id, round=ann.round, family=relay, advertised=ads))
                    for relay in session.relays]
        if self.stage == "share":
            return [(self.topics.secagg_inbox(agent, ann.round),
                     SecureInbox(run_id=ann.run_id, round=ann.round, agent_id=agent, bundles=bundles))
                    for agent, bundles in sorted(server.close_sharing().items())]
        if self.stage == "mask":
            request = server.close_masking()  # aborts here, before any share is revealed
            return [(self.topics.secagg_relay(relay, ann.round, "unmask"),
                     SecureUnmask(run_id=ann.run_id, round=ann.round, family=relay, survivors=sorted(request.survivors)))
                    for relay in session.relays]
        session.total = server.finish()
        if server.misfits or server.withheld or server.unattributed:
            log.warning("round %d: %s's unmasking outvoted wrong shares revealed by %s (and unnamed ones of %s); %s "
                        "held shares back", ann.round, family, sorted(server.misfits) or "none",
                        sorted(server.unattributed) or "none", sorted(server.withheld) or "none")
        return []

    def partials(self, run_id: str, site_id: str, claims: dict[str, int], bytes_in: int) -> list[PartialAggregate]:
        """One secure partial per session (FedProto's: under its first family's name, ``grouped_sessions``): the
        unmasked ring sum and its survivors; an unfinished or failed session sends none (its agents rejected, or
        stragglers when the round moved on before it finished)."""
        out = []
        for family, session in sorted(self.sessions.items()):
            ref = self.announcement.states.get(family)
            survivors = set(session.server.survivors) if session.total is not None else set()
            outcomes = {}
            for agent in session.setup.roster:
                if agent in survivors:
                    m = session.metrics.get(agent) or TrainMetrics.model_construct()
                    outcomes[agent] = AgentOutcome(
                        outcome="accepted", samples=min(claims.get(agent, 0), session.setup.weight_cap),
                        eval_accuracy=m.eval_accuracy, eval_loss=m.eval_loss, num_eval_samples=m.num_eval_samples)
                elif session.failure is not None:
                    outcomes[agent] = AgentOutcome(outcome="rejected", reason=RejectReason.SECAGG_REFUSED.value)
                else:
                    outcomes[agent] = AgentOutcome(outcome="straggler")
            fields: dict[str, Any] = {}
            if session.total is not None and survivors and self.announcement.algorithm == "fedproto":
                fields = {"ring_sum": session.total}  # per-class sums and counts: no one weight (the root reads both)
            elif session.total is not None and survivors:
                grid = quantiser(self.setup, session.setup)
                weight = float(grid.dequantise_sum(session.total[-1:], len(survivors))[0]) / self.setup.clip
                fields = {"ring_sum": session.total, "total_weight": max(weight, 0.0) * session.setup.weight_cap}
            out.append(PartialAggregate(
                run_id=run_id, epoch=self.announcement.epoch, site_id=site_id, round=self.announcement.round,
                family=family, base_digest=ref.digest if ref is not None else None, count=len(survivors),
                outcomes=outcomes, bytes_in=bytes_in, **{"total_weight": 0.0, **fields}))
        return out
