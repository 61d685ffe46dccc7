"""Secure rounds (SecAgg+) over the broker: the coordinator relays the stages and learns only the sum.

A train round is announced with ``RoundAnnouncement.secure`` as ``secure_plan`` decides (a family takes part once it
has a global state, under FedProto from round 1); bootstraps and evaluation rounds stay plain (seeded weights and
metrics). Each family's selected agents form one ``SecAggServer`` session (``protocol.secagg``; under FedProto one
session holds every family's, its relays sent to each family's topic). The stages close
on all of a stage's agents answering or on their deadline: advertise (``secagg_stage_s`` after opening)
-> keys relayed; share (another ``secagg_stage_s``) -> each agent's sealed bundles relayed to it;
masked inputs (the round's deadline) -> the survivors announced; reveals (``secagg_stage_s`` more) ->
the masks removed, and the unmasked sum folded into the strategy as one group (as a site's partial is),
its survivors entering the round as answered agents without arrays (under SCAFFOLD the one sum holds the
control deltas' too, folded beside the deltas: ``protocol.secagg.vector``; under FedProto the per-class sums of
count-weighted prototypes and the counts: ``protocol.secagg.prototype_vector``). The server keeps only a running
sum: no individual update is ever held here. A session that aborts (under its threshold at any stage)
fails the round with the reason, before any share is revealed where the masking stage is the cause.
A masked input or reveal after its stage closed is refused (``SecAggRefused``): a late agent never
gets both its self-mask and its pairwise masks revealed. A restart mid-round fails that round: the
running sum is not checkpointed, and the agents' secrets died with their answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coordinator.aggregation import AggregationError
from coordinator.fleet.agents import AgentRecord
from coordinator.reasons import RejectReason
from coordinator.round import secure_plan, secure_sites
from coordinator.round.opening import open_round_record
from coordinator.round.secure_session import (
    STAGES,
    TOPIC_STAGE,
    Session,
    StageClock,
    grouped_sessions,
    sample_means,
    take_stage,
)
from coordinator.settings import CoordinatorSettings
from coordinator.state.central_privacy import CentralPrivacyLedger
from coordinator.state.rounds import OpenRound
from protocol.errors import ProtocolError
from protocol.messages import RoundAnnouncement, TrainMetrics, Update
from protocol.secagg.accounting import round_rdp
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted, SecAggRefused
from protocol.secagg.prototype_vector import decode_prototype_sums
from protocol.secagg.server import SecAggServer
from protocol.secagg.vector import decode_sum
from protocol.secagg.wire import (
    STAGE_MESSAGES,
    AdvertisedKeys,
    SecureFamily,
    SecureInbox,
    SecureKeys,
    SecureSetup,
    SecureUnmask,
)
from protocol.security.trust import decode_trusted
from protocol.wire import encode_message

if TYPE_CHECKING:  # parts.py builds this driver
    from coordinator.round.parts import EngineParts
    from coordinator.round.run_state import RunState

log = logging.getLogger("coordinator.round.engine")

FAILED = ("failed", "secure_aggregation")


class SecureRounds:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.round: tuple[str, int] | None = None
        self.setup: SecureSetup | None = None
        self.sessions: dict[str, Session] = {}
        self.family_of: dict[str, str] = {}
        self.clock = StageClock()
        self.skipped: list[str] = []
        """Families of the round being planned that cannot run a secure session, and why."""
        self.at_sites: dict[tuple[str, str], SecureFamily] = {}  # the sessions site aggregators serve this round
        self.ledger = CentralPrivacyLedger(settings.secagg_dp_delta) if settings.secagg_noise_multiplier else None
        """Distributed DP: what the released noisy sums cost (checkpointed with the run)."""
        self.unmasked: list[SecureFamily] = []
        """The root's own sessions whose sums this round unmasked: released, whatever happens to the round after."""
        self.charged = False
        """Whether this round's releases were charged to the ledger (once, whether the round completes or fails)."""

    # -- opening ---------------------------------------------------------------------------
    def plan(self, parts: EngineParts, announcement: RoundAnnouncement,
             records: dict[str, AgentRecord]) -> RoundAnnouncement:
        """The announcement with its ``secure`` part where the round is secure (``secure_plan``)."""
        enrolled = parts.enrollment

        def site_key(site: str) -> bytes | None:
            entry = enrolled.get(site) if enrolled is not None else None
            return entry.key.raw if entry is not None else None
        planned, self.skipped = secure_plan.plan(self.settings, parts.strategy.states, announcement, records,
                                                 parts.rosters.site_of, site_key)
        return planned

    def begin(self, parts: EngineParts, run: RunState) -> None:
        """The round just opened: a session per family its announcement declares."""
        open_round = run.open
        assert open_round is not None
        setup = open_round.announcement.secure
        self.sessions, self.family_of, self.setup, self.clock = {}, {}, setup, StageClock()
        self.unmasked, self.charged = [], False
        self.at_sites = secure_sites.expected(setup)
        if setup is None:
            self.round = None
            return
        self.round = (run.run_id, open_round.number)
        problems = []
        for fam, relays in grouped_sessions(setup.families).values():  # FedProto: one session under each family's name
            family = relays[0] if len(relays) == 1 else secure_plan.shared_session(relays)
            try:
                config = RoundConfig(open_round.number, tuple(fam.roster), fam.n_params, fam.graph_seed,
                                     fam.degree, fam.threshold, setup.prg)
            except ValueError as exc:
                problems.append(f"{family}: {exc}")
                continue
            state = parts.strategy.states.get(family)  # FedProto's first round has none: its layout is the task's
            self.sessions[family] = Session(
                family, fam, SecAggServer(config), state.weights if state is not None else {},
                state.control if state is not None and setup.control_clip is not None else None,
                secure_plan.prototype_shape(self.settings), relays=tuple(sorted(relays)))
            self.family_of.update((agent, family) for agent in fam.roster)
        open_round.secure = {"families": {}, "stages": {}}
        self._enter("advertise", open_round.opened, open_round.opened + setup.advertise_s)
        if problems or not (self.sessions or self.at_sites):
            self._fail(parts, open_round, "; ".join(problems + self.skipped) or "no family to aggregate securely")

    # -- inbound ---------------------------------------------------------------------------
    def receive(self, parts: EngineParts, run: RunState, topic: str, payload: bytes) -> None:
        sender = topic.split("/")[-3] if topic.count("/") >= 3 else "unknown"
        try:
            parsed = parts.topics.parse(topic)
            if parsed.kind != "secagg" or parsed.stage not in TOPIC_STAGE:
                return self._refuse(parts, sender, RejectReason.TOPIC_MISMATCH, f"not an agent's stage topic: {topic[:120]}")
            received = decode_trusted(payload, STAGE_MESSAGES[parsed.stage], parts.intake.update_limits,
                                      parts.intake.trust)
        except ProtocolError as exc:
            parts.rejects.record("secagg", exc.reason.value, sender, exc.detail)
            return None
        agent, stage, message = parsed.agent_id or "", TOPIC_STAGE[parsed.stage], received.message
        parts.metrics.secagg_bytes.labels(stage, "in").inc(len(payload))
        if received.signer is not None and received.signer != agent:
            return self._refuse(parts, agent, RejectReason.SIGNER_MISMATCH, f"signed by {received.signer}")
        named = getattr(message, "agent_id", None) or getattr(getattr(message, "keys", None), "agent_id", None)
        if (named, message.round) != (agent, parsed.round) or message.run_id != run.run_id:  # type: ignore[attr-defined]
            return self._refuse(parts, agent, RejectReason.TOPIC_MISMATCH, "the message names another agent, round or run")
        open_round = run.open
        if open_round is None or self.round != (run.run_id, parsed.round) or open_round.secure_done:
            late = parsed.round is not None and parsed.round < run.next_round
            return self._refuse(parts, agent, RejectReason.LATE if late else RejectReason.NO_OPEN_ROUND,
                                f"round {parsed.round} is {'closed' if late else 'not open'} for secure aggregation")
        session = self.sessions.get(self.family_of.get(agent, ""))
        if session is None:
            return self._refuse(parts, agent, RejectReason.UNSELECTED, f"not in round {parsed.round}'s secure roster")
        open_round.bytes_in += len(payload)
        self.clock.bytes_in[stage] += len(payload)
        try:
            self._take(session, agent, stage, message)
        except SecAggRefused as exc:
            return self._refuse(parts, agent, RejectReason.SECAGG_REFUSED, str(exc))
        session.members[stage].add(agent)

    def _take(self, session: Session, agent: str, stage: str, message: Any) -> None:
        take_stage(session.server, session.setup, session.relays, agent, stage, message, session.metrics)
        if stage == "advertise":
            session.families[agent] = message.family

    def _refuse(self, parts: EngineParts, agent: str, reason: RejectReason, detail: str) -> None:
        parts.rejects.record("secagg", reason.value, agent, detail)

    # -- the clock -------------------------------------------------------------------------
    def advance(self, parts: EngineParts, run: RunState, now: float) -> None:
        """Close the open stage when all its agents answered or at its deadline; fail a round it cannot finish."""
        open_round = run.open
        if open_round is None or open_round.announcement.secure is None or open_round.secure_done:
            return
        if self.round != (run.run_id, open_round.number):
            open_round.secure = {"families": {}, "stages": {}}
            self._fail(parts, open_round, "the coordinator restarted during the round: a secure round's running "
                                          "sum is not checkpointed, and the agents' stages cannot be replayed")
            return
        stage = self.clock.stage
        if stage == "done":
            return self._sites_done(parts, open_round, now)
        expected = {"advertise": lambda s: set(s.setup.roster), "share": lambda s: s.members["advertise"],
                    "mask": lambda s: s.members["share"], "unmask": lambda s: s.members["mask"]}[stage]
        complete = all(s.members[stage] >= expected(s) or (stage == "unmask" and self._enough_reveals(s))
                       for s in self.sessions.values())
        if not complete and now < self.clock.deadline:
            return
        try:
            self._close(parts, run, open_round, stage, now)
        except (SecAggAborted, AggregationError, ValueError) as exc:
            self._fail(parts, open_round, str(exc))
        if self.clock.stage == "done" and not open_round.secure_done:
            self._sites_done(parts, open_round, now)

    def _sites_done(self, parts: EngineParts, open_round: OpenRound, now: float) -> None:
        """The root's own sessions are unmasked: done once the sites' sums are in too (``secure_sites``)."""
        if secure_sites.secure_sums_in(open_round, self.at_sites, now, secure_sites.setup_deadline(open_round)):
            if self.at_sites and open_round.secure is not None:
                open_round.secure["sites"] = secure_sites.account(open_round, self.at_sites)
            self._account_noise(parts, open_round)
            open_round.secure_done = True

    @staticmethod
    def _enough_reveals(session: Session) -> bool:
        """Whether the reveals so far hold ``threshold`` shares of every secret the unmasking needs, and they open
        them: then a survivor that went silent after uploading is not waited for (its self-mask is rebuilt without
        it)."""
        config, members, withheld = session.server.config, session.members, session.server.withheld
        shared, revealed, survivors = members["share"], members["unmask"], members["mask"]
        for agent in shared:
            around = config.neighbours_of(agent) & shared
            if not (agent in survivors or around & survivors):
                continue
            if len({h for h in around & revealed if agent not in withheld.get(h, ())}) < config.threshold:
                return False
        return session.server.ready()  # and they open every secret: a wrong share is outvoted, or waited past

    def _close(self, parts: EngineParts, run: RunState, open_round: OpenRound, stage: str, now: float) -> None:
        setup = self.setup
        assert setup is not None
        for session in self.sessions.values():
            previous = set(session.setup.roster) if stage == "advertise" else session.members[STAGES[STAGES.index(stage) - 1]]
            parts.metrics.secagg_dropouts.labels(stage).inc(len(previous - session.members[stage]))
        if stage == "advertise":
            for session in self.sessions.values():
                session.server.close_advertising()
                ads = [AdvertisedKeys(agent_id=a.agent, encryption_key=a.encryption_key, mask_key=a.mask_key,
                                      commitment=a.self_mask_commitment)
                       for _, a in sorted(session.server.advertised.items())]
                for family in session.relays:
                    self._publish(parts, open_round, "advertise", parts.topics.secagg_relay(family, open_round.number, "keys"),
                                  SecureKeys(run_id=run.run_id, round=open_round.number, family=family, advertised=ads))
            following = ("share", open_round.opened + setup.advertise_s + setup.share_s)
        elif stage == "share":
            for session in self.sessions.values():
                inbox = session.server.close_sharing()
                for agent, bundles in sorted(inbox.items()):
                    self._publish(parts, open_round, "share", parts.topics.secagg_inbox(agent, open_round.number),
                                  SecureInbox(run_id=run.run_id, round=open_round.number, agent_id=agent, bundles=bundles))
            following = ("mask", max(open_round.deadline, now))
        elif stage == "mask":
            requests = [session.server.close_masking() for session in self.sessions.values()]  # aborts here, before any share is revealed
            if setup.noise is not None:  # durable before any reveal is asked for: a restart charges this release
                parts.actions.add(open_round_record(run.run_id, open_round, unmasking=True))
            for session, request in zip(self.sessions.values(), requests, strict=True):
                for family in session.relays:
                    self._publish(parts, open_round, "mask", parts.topics.secagg_relay(family, open_round.number, "unmask"),
                                  SecureUnmask(run_id=run.run_id, round=open_round.number, family=family,
                                               survivors=sorted(request.survivors)))
            following = ("unmask", now + setup.unmask_s)
        else:
            self._finish(parts, run, open_round)
            following = ("done", now)
        self._record_stage(parts, open_round, stage, now)  # with the bytes it relayed as it closed
        self._enter(following[0], now, following[1])

    def _finish(self, parts: EngineParts, run: RunState, open_round: OpenRound) -> None:
        """Every session unmasks its sum; only then is anything folded (a failure leaves the strategy as it was)."""
        assert self.setup is not None and open_round.secure is not None
        folds = [(session, self._unmasked(parts, session)) for session in self.sessions.values()]
        for family, session in self.sessions.items():
            open_round.secure["families"][family] = self._account(session)
            if session.server.misfits or session.server.unattributed:
                log.warning("round %d: %s's unmasking outvoted wrong shares revealed by %s, and unnamed ones of %s",
                            open_round.number, family, ", ".join(sorted(session.server.misfits)) or "none",
                            ", ".join(sorted(session.server.unattributed)) or "none")
        for session, fold in folds:
            if not fold():
                raise ValueError(f"{parts.strategy.algorithm} with {parts.strategy.aggregator.describe()} does not "
                                 f"fold unmasked sums")
            self._enter_answered(parts, run, open_round, session, set(session.server.survivors))
        log.info("round %d: secure sums unmasked for %s", open_round.number,
                 ", ".join(f"{f} ({len(s.server.survivors)} agents)" for f, s in self.sessions.items()))

    def _account_noise(self, parts: EngineParts, open_round: OpenRound) -> None:
        """Distributed DP: the sums just released spend one mechanism of the announced noise (at least: a family's
        sum of n >= shares survivors carries sqrt(n / shares) times more noise)."""
        setup = self.setup
        released = self.unmasked + secure_sites.released(open_round, self.at_sites)
        if (setup is None or setup.noise is None or self.ledger is None or open_round.secure is None or not released
                or self.charged):
            return
        noise = setup.noise
        self.ledger.spend(round_rdp(setup, released))
        self.charged = True
        epsilon = self.ledger.epsilon
        parts.metrics.secagg_dp_epsilon.set(epsilon)
        open_round.secure["noise"] = {"mechanism": noise.mechanism, "noise_multiplier": noise.noise_multiplier,
                                      "clip_norm": noise.clip_norm,
                                      "shares": noise.shares, "rounds": self.ledger.rounds,
                                      "epsilon": round(epsilon, 6), "delta": self.ledger.delta}
        log.info("round %d: distributed DP: %d noisy sums released, epsilon %.4g at delta %g", open_round.number,
                 self.ledger.rounds, epsilon, self.ledger.delta)

    def _unmasked(self, parts: EngineParts, session: Session) -> Callable[[], bool]:
        """Unmask a session's sum now; returns what folds it into the strategy (False: the strategy cannot): the
        means of its payloads (``delta``, and ``control_delta`` under SCAFFOLD), or under FedProto the per-class
        sums of count-weighted prototypes and the per-class counts."""
        setup = self.setup
        assert setup is not None
        total = session.server.finish()
        self.unmasked.append(session.setup)  # seen from here on: charged even if a later session fails the round
        survivors = set(session.server.survivors)
        strategy, family = parts.strategy, session.family
        cap = session.setup.weight_cap
        if session.prototypes is not None:
            prototypes, counts = decode_prototype_sums(total, len(survivors), session.prototypes[0], setup,
                                                       session.setup)
            most = secure_sites.most_counted(parts, survivors, cap, session.prototypes[0])
            implausible = secure_sites.plausible_prototypes(prototypes, counts, most, len(survivors), setup,
                                                            session.setup)
            if implausible is not None:
                raise ValueError(f"{family}'s unmasked sum is refused: {implausible}")
            return lambda: strategy.accumulate_prototype_sums(family, prototypes, counts, survivors)
        sums, weight = decode_sum(total, len(survivors), session.like, setup, session.setup, session.control_like)
        implausible = secure_sites.plausible_sum(sums, weight, secure_sites.weight_range(parts, survivors, cap),
                                                 len(survivors), setup, session.setup)
        if implausible is not None:  # one agent's input can be anything in the ring: fail rather than apply it
            raise ValueError(f"{family}'s unmasked sum is refused: {implausible}")
        means = sample_means(sums, weight, len(survivors), session.setup.weight_cap, session.like, session.control_like)
        return lambda: strategy.accumulate_sums(family, means, survivors)

    def _enter_answered(self, parts: EngineParts, run: RunState, open_round: OpenRound, session: Session,
                        survivors: set[str]) -> None:
        """Survivors count as answered (sample count and metrics, no arrays), as a site's agents do."""
        ann = open_round.announcement
        for agent in sorted(survivors):
            record = parts.registry.get(agent)
            samples = min(record.status.num_samples if record is not None else 0, session.setup.weight_cap)
            family = session.families.get(agent, session.relays[0])
            state = parts.strategy.states.get(family)
            open_round.updates[agent] = Update.model_construct(
                run_id=run.run_id, agent_id=agent, round=ann.round, task=ann.task, task_ref=ann.task_ref,
                family=family, base_digest=state.digest if state is not None else "",  # FedProto's first: no state
                num_samples=samples,
                metrics=session.metrics.get(agent) or TrainMetrics.model_construct())
            parts.applied.record(agent, ann.round)
            parts.metrics.updates.labels("accepted").inc()

    def _account(self, session: Session) -> dict[str, Any]:
        m, server = session.members, session.server
        return {
            "roster": len(session.setup.roster), "degree": session.setup.degree, "threshold": session.setup.threshold,
            "survivors": sorted(server.survivors),
            "dropped": {"advertise": sorted(set(session.setup.roster) - m["advertise"]),
                        "share": sorted(m["advertise"] - m["share"]), "mask": sorted(m["share"] - m["mask"]),
                        "unmask": sorted(m["mask"] - m["unmask"])},
            # Self-masks of survivors that did not answer the unmasking were rebuilt from their neighbours'
            # shares; pairwise masks of agents that shared but did not upload were removed from their keys.
            "recovered": {"self_masks": sorted(set(server.survivors) - m["unmask"]),
                          "pairwise_masks": sorted(server.recovered)},
            # Survivors that held back shares (a neighbour's bundle did not open for them), holders whose revealed
            # share was off its dealer's polynomial (it lied, or the dealer sealed it a wrong one), and agents whose
            # secret opened with wrong shares among its own, too many to tell whose: outvoted, not used.
            "withheld_shares": {h: sorted(a) for h, a in sorted(server.withheld.items())},
            "misfit_shares": {h: sorted(a) for h, a in sorted(server.misfits.items())},
            "unattributed_shares": sorted(server.unattributed),
        }

    # -- helpers ---------------------------------------------------------------------------
    def _enter(self, stage: str, now: float, deadline: float) -> None:
        self.clock.stage, self.clock.opened, self.clock.deadline = stage, now, deadline

    def _record_stage(self, parts: EngineParts, open_round: OpenRound, stage: str, now: float) -> None:
        seconds = max(0.0, now - self.clock.opened)
        if not self.sessions:  # every session is a site's: the root ran no stage
            return
        parts.metrics.secagg_stage.labels(stage).observe(seconds)
        if open_round.secure is not None:
            open_round.secure["stages"][stage] = {"seconds": round(seconds, 4), "bytes_in": self.clock.bytes_in[stage],
                                                  "bytes_out": self.clock.bytes_out[stage]}

    def _publish(self, parts: EngineParts, open_round: OpenRound, stage: str, topic: str, message: Any) -> None:
        payload = parts.publisher.sealed(encode_message(message))
        sent = parts.publisher.publish(topic, payload, f"secagg_{stage}", retain=False)
        open_round.bytes_out += sent
        self.clock.bytes_out[stage] += sent
        parts.metrics.secagg_bytes.labels(stage, "out").inc(sent)

    def _fail(self, parts: EngineParts, open_round: OpenRound, reason: str) -> None:
        """The round closes as failed: nothing is folded, no sum released, survivors do not count as answered."""
        log.error("round %d: %s", open_round.number, reason)
        if open_round.secure is not None:
            open_round.secure["failure"] = reason
            open_round.secure["families"] = {f: self._account(s) for f, s in self.sessions.items()}
        open_round.updates.clear()
        open_round.ending, open_round.secure_done = FAILED, True
        self.clock.stage = "done"
        self._account_noise(parts, open_round)  # sums unmasked before the failure were released all the same
