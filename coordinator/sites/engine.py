"""The site aggregator's engine: sans-IO, like the root's. Messages and ticks in, (topic, payload) to publish out.

It follows the root's round announcements (down the site's bridge), learns its agents from their statuses
(which the site broker holds; they also go up the bridge, so the root can select them), and admits their
updates with the root's admission code: the intake (decode limits, signatures of enrolled agents, chunks),
``admit_status`` and ``admit_update`` under the synchronous policy (selected, not yet answered, task and
layout, base digest, claim cap, norm). It closes a round at ``site_deadline_fraction`` of the round's
deadline, or once every agent of the site the round selected has an outcome, and publishes one signed
``PartialAggregate`` per family up the bridge. Agents' updates never leave the site.

Its state is the open round only: a restarted site aggregator has lost what it had folded, and reports
those agents as stragglers at its deadline (the root never counts anything twice: a second partial
of a site and family, or one naming an agent already counted, is refused whole). What its persistent
session queued on the site broker while it was down is not lost: updates that arrive before their
round's announcement or their agent's status are held until those come (``held.py``), and for
``SETTLE_S`` after each (re)connect the round does not close early, while the retained statuses land.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable

from coordinator.admission.decisions import Accept, Forget, Observe, Reject
from coordinator.admission.intake import Intake, Refused, StatusCleared, StatusIn, UpdateIn
from coordinator.admission.statuses import admit_status
from coordinator.admission.task_agreement import TaskAgreement
from coordinator.admission.updates import admit_update
from coordinator.admission.view import AdmissionView
from coordinator.aggregation.aggregator import build_aggregator
from coordinator.fleet.agents import AgentRegistry
from coordinator.fleet.enrollment import Enrollment
from coordinator.policies.synchronous import SynchronousPolicy
from coordinator.reasons import RejectReason
from coordinator.round.secure_session import TOPIC_STAGE
from coordinator.sites.folding import SiteRound
from coordinator.sites.held import HeldUpdates
from coordinator.sites.payloads import FOLDED, SitePayloads
from coordinator.sites.resend import LastPartials
from coordinator.sites.roster import RosterBook
from coordinator.sites.secure import SiteSecureRound
from coordinator.sites.settings import SiteSettings
from coordinator.state.applied import AppliedVersions
from coordinator.state.rounds import OpenRound
from coordinator.state.versions import VersionLog
from coordinator.telemetry.heterogeneity import LabelSkew
from coordinator.telemetry.metrics import CoordinatorMetrics
from coordinator.telemetry.rejects import RejectLog
from protocol.compression import CompressionSpec
from protocol.errors import ProtocolError
from protocol.limits import DecodeLimits
from protocol.messages import CoordinatorStatus, RoundAnnouncement, Update
from protocol.secagg.errors import SecAggRefused
from protocol.secagg.wire import STAGE_MESSAGES
from protocol.security.signing import PublicKey, SigningKey, single_key
from protocol.security.trust import OPEN, Trust, decode_trusted
from protocol.site_rosters import SiteResync
from protocol.topics import Topics
from protocol.wire import encode_message

log = logging.getLogger(__name__)

ANNOUNCEMENT_LIMITS = DecodeLimits(max_payload_bytes=1024 * 1024, max_array_elements=1, max_total_elements=1)
RESYNC_LIMITS = DecodeLimits(max_payload_bytes=4 * 1024 * 1024, max_array_elements=1, max_total_elements=1)
Outgoing = list[tuple[str, bytes]]
SETTLE_S = 1.0
"""After a (re)connect, the round closes only at its deadline for this long: the broker is replaying the retained
statuses, and a round whose known agents all answered may still have agents whose status is on its way."""


class SiteEngine:
    def __init__(self, settings: SiteSettings, metrics: CoordinatorMetrics, *, signing_key: SigningKey | None,
                 coordinator_key: PublicKey | None, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.settings, self.metrics, self.clock, self.wall_clock = settings, metrics, clock, wall_clock
        self.signing_key = signing_key
        self.topics = Topics(settings.federation)
        self.enrollment = Enrollment(settings.enrollment_path, clock) if settings.enrollment == "required" else None
        self.root_trust = OPEN if coordinator_key is None else Trust(single_key("coordinator", coordinator_key), True)
        self.registry = AgentRegistry(settings.agent_timeout_s, settings.max_known_agents)
        self.task = TaskAgreement(settings.task_card())
        self.payloads, self.policy = SitePayloads(self.task.card), SynchronousPolicy()
        aggregator = build_aggregator(settings)
        self.rule = aggregator if aggregator.needs_individual_updates else None
        """A robust rule applied inside the site at each close (``folding.py``); None: the mean, folded as updates come."""
        self.labels, self.versions, self.applied = LabelSkew(self.task.card.num_classes or None), VersionLog(0), \
            AppliedVersions()
        self.rejects = RejectLog(metrics)
        trust = OPEN if self.enrollment is None else Trust(self.enrollment.lookup, required=True)
        self.intake = Intake(self.topics, metrics, trust, CompressionSpec.parse("none"), settings.max_update_bytes,
                             self.task.card.num_classes, self.rejects)
        self.run_id, self.epoch, self.next_round = "", 0, 1
        self.round: SiteRound | None = None
        self.held = HeldUpdates(settings.max_known_agents)
        self._mine_now: dict[str, str] | None = None
        """``_mine()`` of the open round, kept as statuses come and go (the round may select many more agents
        than the site has: computed from the selection once per round, not at every message)."""
        self.settle_until = 0.0
        self.book = RosterBook(settings.site_id, settings.roster_interval_s, wall_clock())
        """What the root was told of the site's agents (their statuses do not cross the bridge: ``roster.py``)."""
        self.sent: list[int] = []
        """Rounds whose partials this process published (for tests and logs)."""
        self.last_partials = LastPartials()
        """Sent again to a new root session that has their round open (``resend.py``)."""
        self.root_session: str | None = None
        """The root's session, from its signed status (what agents resend their update on, too)."""

    # -- events -----------------------------------------------------------------------------
    def on_message(self, topic: str, payload: bytes) -> Outgoing:
        if topic == self.topics.rounds_current:
            return self._announced(payload)
        if topic == self.topics.coordinator_status:
            return self._root_status(payload)
        if topic.startswith(f"{self.topics.root}/secagg/"):
            self._secure_stage(topic, payload)
            return []
        if topic == self.topics.site_resync(self.settings.site_id):
            self._resync(payload)
            return []
        inbound = self.intake.receive(topic, payload, {}, self.next_round)  # later rounds' wait for their announcement
        if isinstance(inbound, StatusIn):
            self._status(inbound)
        elif isinstance(inbound, StatusCleared):
            self._forget(inbound.agent_id)
        elif isinstance(inbound, UpdateIn):
            self._update(inbound)
        elif isinstance(inbound, Refused):
            reject = inbound.reject
            if reject.reason is RejectReason.COMPRESSION_MISMATCH and inbound.kind == "update":
                reject = Reject(RejectReason.SITE_UNSUPPORTED, "a site aggregator does not unpack compressed deltas "
                                                               "(it holds no global state): run the root uncompressed")
                if self.round is not None and inbound.sender in self.round.open.selected_set:
                    self.round.reject(inbound.sender, reject.reason.value)  # counted rejected at the root, not late
            self.rejects.record(inbound.kind, reject.reason.value, inbound.sender, reject.detail)
        return []

    def connected(self) -> None:
        """The link to the site broker (re)connected: retained statuses are on their way (see ``SETTLE_S``)."""
        self.settle_until = self.clock() + SETTLE_S

    def tick(self) -> tuple[float, Outgoing]:
        """Send the roster when due; close the round when its site deadline passed or every agent of the site
        answered."""
        now = self.clock()
        out = [(self.topics.site_roster(self.settings.site_id), self._sealed(encode_message(roster)))
               for roster in self.book.rosters(now)]
        wait, closed = self._tick_round(now)
        return min(wait, self.book.due_in(now)), out + closed

    def _tick_round(self, now: float) -> tuple[float, Outgoing]:
        r = self.round
        if r is None:
            return 0.5, []
        if r.secure is not None:  # its sessions decide: the partials go up once their sums are unmasked
            relays = [(topic, self._sealed(encode_message(message))) for topic, message in r.secure.advance(now)]
            if r.secure.done:
                return 0.0, relays + self._close()
            return max(0.0, min(r.secure.deadline - now, 0.5)), relays
        mine = self._mine()
        if now >= r.open.deadline or (now >= self.settle_until and mine and mine.keys() <= r.outcomes.keys()):
            return 0.0, self._close()
        return max(0.0, min(r.open.deadline - now, 0.5)), []

    # -- internals ----------------------------------------------------------------------------
    def _view(self) -> AdmissionView:
        s = self.settings
        return AdmissionView(
            run_id=self.run_id, next_round=self.next_round, open_round=self.round.open if self.round else None,
            closing=False, now=self.clock(), agents=self.registry, task=self.task, payloads=self.payloads,
            versions=self.versions, applied=self.applied, labels=self.labels, enrolled=self.enrollment,
            max_samples=s.max_samples_per_update, claim_cap_multiple=s.claim_cap_multiple, weighting="samples",
            kl_temperature=s.kl_temperature)

    def _mine(self) -> dict[str, str]:
        """Agents of this site the open round selected (those whose status the site broker holds) -> family."""
        assert self.round is not None
        if self._mine_now is None:
            families = ((a, self.registry.family_of(a)) for a in self.round.open.selected)
            self._mine_now = {a: f for a, f in families if f is not None}
        return self._mine_now

    def _forget(self, agent_id: str) -> None:
        self.registry.forget(agent_id)
        self.book.forgot(agent_id)
        if self._mine_now is not None:
            self._mine_now.pop(agent_id, None)

    def _announced(self, payload: bytes) -> Outgoing:
        if not payload:  # the root cleared a stale announcement
            return []
        try:
            announcement = decode_trusted(payload, RoundAnnouncement, ANNOUNCEMENT_LIMITS, self.root_trust).message
        except ProtocolError as exc:
            self.rejects.record("round", exc.reason.value, "coordinator", exc.detail)
            return []
        if announcement.epoch < self.epoch or (announcement.run_id == self.run_id
                                               and announcement.round < self.next_round):
            return self._resend(announcement.run_id, announcement.round)  # an older run's, or closed here
        if self.round is not None and self.round.open.number == announcement.round and announcement.run_id == \
                self.run_id:
            return []
        out = self._close() if self.round is not None else []  # the root moved on: what the site has goes up now
        self.run_id, self.epoch = announcement.run_id, announcement.epoch
        age = min(max(0.0, self.wall_clock() - announcement.issued_at), announcement.deadline_s)
        now = self.clock()
        deadline = now + max(0.0, self.settings.site_deadline_fraction * announcement.deadline_s - age)
        claims = [r.status.num_samples for a in announcement.selected if (r := self.registry.get(a)) is not None]
        open_round = OpenRound(announcement, payload, deadline, now, len(announcement.selected),
                               median_claim=float(statistics.median_low(claims)) if claims else None)
        self.payloads.announcement = announcement
        self._mine_now = None
        known = [r.status.family for a in announcement.selected if (r := self.registry.get(a)) is not None]
        # Selected agents unknown here are mostly other sites' or the root's, but after a restart this site's own
        # statuses may come after the announcement: held for them too, its deltas fold at its close at the latest.
        self.round = SiteRound.start(open_round, self.settings.clip_norm, self.settings.max_norm_ratio, self.rule,
                                     Counter(known), self.settings.aggregation_memory_mb * 1024**2,
                                     others=len(announcement.selected) - len(known))
        held = announcement.secure.sites.get(self.settings.site_id) if announcement.secure is not None else None
        if held is not None:  # the round's secure sessions of this site's agents are served here (secure.py)
            self.round.secure = SiteSecureRound(announcement, held, self.topics, now, age, deadline)
        self.next_round = announcement.round
        unfolded = announcement.algorithm not in FOLDED or (announcement.algorithm == "fedproto"
                                                            and announcement.secure is not None)
        if unfolded and announcement.task == "train" and held is None:
            log.warning("site %s: round %d runs %s%s, whose updates a site aggregator does not fold: its agents' "
                        "updates are refused (site_unsupported); connect them to the root's broker instead",
                        self.settings.site_id, announcement.round, announcement.algorithm,
                        " securely" if announcement.secure is not None else "")
        if announcement.compression != "none" and held is None:
            log.warning("site %s: round %d asks agents to compress (%s), which a site aggregator does not unpack: "
                        "their compressed updates are refused here (site_unsupported), uncompressed ones folded; run "
                        "the root with compression none", self.settings.site_id, announcement.round,
                        announcement.compression)
        log.info("site %s: round %d open, %d of its agents selected, closing in %.1fs", self.settings.site_id,
                 announcement.round, len(self._mine()), deadline - now)
        self._release(lambda inbound: not self._waiting(inbound.update))
        return out

    def _root_status(self, payload: bytes) -> Outgoing:
        if not payload:
            return []
        try:
            status = decode_trusted(payload, CoordinatorStatus, ANNOUNCEMENT_LIMITS, self.root_trust).message
        except ProtocolError as exc:
            self.rejects.record("coordinator_status", exc.reason.value, "coordinator", exc.detail)
            return []
        self.root_session = status.session
        return self._resend(status.run_id, status.round) if status.state == "online" else []

    def _resend(self, run_id: str, round_number: int) -> Outgoing:
        out = self.last_partials.again(run_id, round_number, self.root_session)
        if out:
            log.info("site %s: root session %s has round %d open, which closed here: its partials go up again",
                     self.settings.site_id, self.root_session, round_number)
        return out

    def _status(self, inbound: StatusIn) -> None:
        decision = admit_status(inbound.status, inbound.agent_id, inbound.signer, self._view())
        if isinstance(decision, Forget):
            self._forget(decision.agent_id)
        elif isinstance(decision, Reject):
            self.rejects.record("agent_status", decision.reason.value, inbound.agent_id, decision.detail)
        elif isinstance(decision, Observe):
            seen = self.registry.observe(decision.status.model_copy(update={"label_counts": None}), self.clock())
            if seen.evicted is not None:  # let go here too, and the root is told it is gone
                self.book.forgot(seen.evicted)
                if self._mine_now is not None:
                    self._mine_now.pop(seen.evicted, None)
            self.book.heard(decision.status)  # label counts kept: the root weighs and watches by them
            agent_id = decision.status.agent_id
            if self._mine_now is not None and self.round is not None and agent_id in self.round.open.selected_set:
                self._mine_now[agent_id] = decision.status.family
            self._release(lambda inbound: inbound.update.agent_id == agent_id and not self._waiting(inbound.update))

    def _waiting(self, update: Update) -> bool:
        """Its round's announcement, or its agent's status, is not heard yet (see ``held.py``)."""
        if update.round < self.next_round:
            return False  # a closed round's: late, judged now
        r = self.round
        return r is None or update.round > r.open.number or self.registry.get(update.agent_id) is None

    def _release(self, ready: Callable[[UpdateIn], bool]) -> None:
        for inbound in self.held.release(ready):
            self._update(inbound)

    def _update(self, inbound: UpdateIn) -> None:
        update = inbound.update
        if self._waiting(update):
            if self.held.hold(inbound):
                return
            self.metrics.updates.labels("rejected").inc()
            self.rejects.record("update", RejectReason.DEFERRED_OVERFLOW.value, update.agent_id,
                                f"{len(self.held)} updates already wait for their round or status")
            return
        decision = admit_update(inbound.topic, update, self._view(), self.policy)
        mine = self.round is not None and update.round == self.round.open.number and \
            update.agent_id in self.round.open.selected_set
        if mine and self.round is not None and self.round.secure is not None and update.task == "train" and \
                update.agent_id in self.round.secure.family_of:
            decision = Reject(RejectReason.SECURE_ONLY, f"round {update.round} is securely aggregated at this site")
        if isinstance(decision, Accept):
            assert self.round is not None
            self.round.bytes_in += inbound.size
            self.round.accept(update, decision.samples if decision.samples is not None else update.num_samples,
                              decision.weight, decision.norm)
            self.metrics.updates.labels("accepted").inc()
            return
        reason = decision.reason.value if isinstance(decision, Reject) else "deferred"
        self.metrics.updates.labels("rejected").inc()
        self.rejects.record("update", reason, update.agent_id, getattr(decision, "detail", ""))
        if mine and self.round is not None and reason not in (RejectReason.DUPLICATE.value, RejectReason.SECURE_ONLY.value,
                                                              RejectReason.TOPIC_MISMATCH.value):  # it may still answer
            self.round.reject(update.agent_id, reason)

    def _close(self) -> Outgoing:
        r = self.round
        assert r is not None
        self.round, self.next_round, self._mine_now = None, r.open.number + 1, None
        mine = self._mine_of(r)
        if r.secure is not None:  # its sessions' agents go up in the secure partials, and only there
            claims = {a: rec.status.num_samples for a in r.secure.family_of if (rec := self.registry.get(a)) is not None}
            secured = r.secure.partials(self.run_id, self.settings.site_id, claims, r.bytes_in)
            mine = {a: f for a, f in mine.items() if a not in r.secure.family_of}
        partials = (r.partials(self.run_id, self.settings.site_id, mine) if mine or r.secure is None else []) + \
            (secured if r.secure is not None else [])
        if r.rule_failure is not None:
            log.warning("site %s: round %d: %s; none of those updates is counted", self.settings.site_id,
                        r.open.number, r.rule_failure)
        out = []
        for partial in partials:
            payload = self._sealed(encode_message(partial))
            out.append((self.topics.partial(self.settings.site_id, partial.round), payload))
            log.info("site %s: round %d %s partial: %d folded (weight %.6g), %d outcomes, %d bytes up",
                     self.settings.site_id, partial.round, partial.family, partial.count, partial.total_weight,
                     len(partial.outcomes), len(payload))
        self.sent.append(r.open.number)
        self.last_partials.sent(self.run_id, r.open.number, out, self.root_session)
        self._release(lambda inbound: not self._waiting(inbound.update))  # a closed round's: late now
        return out

    def _secure_stage(self, topic: str, payload: bytes) -> None:
        """One of its agents' secure-aggregation stages: admitted as the root admits them (the agent's enrolled
        signature, this run and round), then given to the site's session."""
        sender = topic.split("/")[-3] if topic.count("/") >= 3 else "unknown"
        r = self.round
        try:
            parsed = self.topics.parse(topic)
            if parsed.kind != "secagg" or parsed.stage not in TOPIC_STAGE:
                raise SecAggRefused(f"not an agent's stage topic: {topic[:120]}")
            received = decode_trusted(payload, STAGE_MESSAGES[parsed.stage], self.intake.update_limits,
                                      self.intake.trust)
            message = received.message
            named = getattr(message, "agent_id", None) or getattr(getattr(message, "keys", None), "agent_id", None)
            if (received.signer is not None and received.signer != parsed.agent_id) or named != parsed.agent_id:
                raise SecAggRefused(f"signed by {received.signer}, naming {named}, on {parsed.agent_id}'s topic")
            if r is None or r.secure is None or (message.run_id, message.round) != (self.run_id, r.open.number):
                raise SecAggRefused(f"round {message.round} is not a secure round open at this site")
            r.secure.receive(sender, TOPIC_STAGE[parsed.stage], message)
        except ProtocolError as exc:
            self.rejects.record("secagg", exc.reason.value, sender, exc.detail)
            return  # refused: its bytes are not the site's agents' input
        except SecAggRefused as exc:
            self.rejects.record("secagg", RejectReason.SECAGG_REFUSED.value, sender, str(exc))
            return
        if r is not None:
            r.bytes_in += len(payload)

    def _sealed(self, payload: bytes) -> bytes:
        return payload if self.signing_key is None else encode_message(self.signing_key.seal(payload))

    def _resync(self, payload: bytes) -> None:
        """The root asks for statuses it is missing (it restarted, or forgot agents this site still hears)."""
        try:
            request = decode_trusted(payload, SiteResync, RESYNC_LIMITS, self.root_trust).message
        except ProtocolError as exc:
            self.rejects.record("site_resync", exc.reason.value, "coordinator", exc.detail)
            return
        if request.site_id == self.settings.site_id:
            self.book.resync(request.agents)
            log.info("site %s: the root asked for %s", self.settings.site_id,
                     "every agent's status" if request.agents is None else f"{len(request.agents)} agents' statuses")

    def _mine_of(self, r: SiteRound) -> dict[str, str]:
        families = {a: self.registry.family_of(a) for a in r.open.selected}
        mine = {a: f for a, f in families.items() if f is not None}
        for agent_id in r.outcomes:  # answered, whatever the registry says now
            mine.setdefault(agent_id, r.open.updates[agent_id].family if agent_id in r.open.updates else "")
        return {a: f for a, f in mine.items() if f}
