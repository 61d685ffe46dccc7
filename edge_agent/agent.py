"""The edge agent's main loop: hear announcements, fetch global state, train, publish.

MQTT callbacks only enqueue; this loop does the work on one thread, so nothing blocks the
network thread (keep-alives and acknowledgements keep flowing). Local training runs on a
training thread of its own (``training_thread``), one round at a time, and its outcome comes
back through the same inbox: while a device trains, the loop keeps heartbeating (a round
that outlasts the coordinator's agent timeout does not make the agent look dead) and keeps
handling coordinator status, announcements, global states and stop requests. Only the loop
changes the agent's state or publishes; while a round trains, heartbeats report the privacy
spend read when it started, never the ledger that the round is changing.

A stop request (or a finished run with ``exit_when_finished``) while a round trains is obeyed
at once: the agent says it is offline and ``run`` returns without waiting for the round,
which cannot be interrupted; the training thread is a daemon, and the round's outcome is
dropped (not sent, not recorded as answered), as if the device had lost power mid-round.

Surviving faults:
* a reconnect re-subscribes, and the retained announcement and global state tell the agent
  where the run is; a round it missed while disconnected is answered if still announced;
* a process that starts while a round it was selected for is in progress (it restarted
  mid-round, so the coordinator counted it as dropped) joins from the next round;
* when the coordinator's session changes (it restarted, or the broker lost its queue) and
  it re-announces a round this agent already answered, the agent sends the same update
  again: the coordinator may have lost it; a copy it already has is dropped as a duplicate;
* optional simulated straggling holds a finished update back for a drawn delay, during
  which the agent keeps its heartbeat but takes no new round (it is "still computing").

Not surviving: a broker that refuses its publishes or subscriptions (MQTT 5 reason codes, e.g.
an ACL's "not authorized"): each refusal is counted in its status (``denied``), and after
``max_denials`` the agent exits with ``EXIT_DENIED`` (``edge_agent.identity``).
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections import Counter
from typing import Any

from paho.mqtt.client import MQTTMessageInfo

from edge_agent.algorithms.scaffold import undo_if_left_out
from edge_agent.coordinator_notes import CoordinatorNotes
from edge_agent.freshness import Freshness, announcement_refusal
from edge_agent.global_states import GlobalStates
from edge_agent.identity import give_up
from edge_agent.outbox import UpdateOutbox
from edge_agent.pending import HeldUpdate, read_progress, write_progress
from edge_agent.privacy.errors import BudgetExhausted, PrivacyUnsupported
from edge_agent.profiles import DeviceProfile
from edge_agent.secure import SecureParticipant
from edge_agent.state import AgentStateDir
from edge_agent.stragglers import OFF, DelayModel
from edge_agent.training_thread import TrainingOutcome, TrainingThread, train_round
from edge_agent.worker import LocalWorker
from protocol.errors import ProtocolError
from protocol.limits import DecodeLimits
from protocol.messages import (
    AgentStatus,
    CoordinatorStatus,
    Notice,
    PrivacySpent,
    RoundAnnouncement,
    TaskAnnouncement,
    Update,
)
from protocol.security.signing import PublicKey, SigningKey, single_key
from protocol.security.trust import OPEN, Trust, decode_trusted
from protocol.topics import Topics
from protocol.transport.mqtt import Backoff, BrokerAddress, MqttLink, Will
from protocol.version import SOFTWARE_VERSION
from protocol.wire import encode_message

log = logging.getLogger(__name__)

_SMALL = DecodeLimits(max_payload_bytes=1024 * 1024, max_array_elements=1, max_total_elements=1)


class EdgeAgent:
    def __init__(
        self,
        agent_id: str,
        federation: str,
        broker: BrokerAddress,
        profile: DeviceProfile,
        worker: LocalWorker,
        state: AgentStateDir,
        *,
        heartbeat_s: float = 15.0,
        max_message_bytes: int = 0,
        exit_when_finished: bool = False,
        straggler: DelayModel = OFF,
        backoff: Backoff | None = None,
        signing_key: SigningKey | None = None,
        coordinator_key: PublicKey | None = None,
        max_denials: int = 3,
        secagg_audit: bool = False,
        secagg_vanish_after: str | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.profile = profile
        self.worker = worker
        self.state = state
        self.topics = Topics(federation)
        self.broker = broker
        self.heartbeat_s = heartbeat_s
        self.max_message_bytes = max_message_bytes
        self.exit_when_finished = exit_when_finished
        self.straggler = straggler
        self.backoff = backoff
        self.max_denials = max_denials
        """Refusals by the broker (MQTT 5) after which ``run`` gives up (``edge_agent.identity``)."""
        self.signing_key = signing_key
        """Signs this agent's statuses and updates (None: unsigned, for an open federation)."""
        self._trust = OPEN if coordinator_key is None else Trust(single_key("coordinator", coordinator_key), required=True)
        """With the coordinator's key pinned, only what it signed is acted on."""
        self.freshness = Freshness(state, persist=coordinator_key is not None)
        """The run it follows (newest coordinator epoch) and its own statuses' order (``edge_agent.freshness``)."""
        self.rejected: Counter[str] = Counter()
        """Messages dropped, by reason; the first of each reason is logged."""
        self.session = secrets.token_hex(6)
        """New on every process start; the coordinator counts a change as a restart."""
        self.announcement: RoundAnnouncement | None = None
        self.problem: str | None = None
        """Why this agent refuses the current rounds (task, version, layout, algorithm); sent in its status."""
        self.global_states = GlobalStates(worker.family, self.topics, self._trust)
        self.coordinator: CoordinatorStatus | None = None
        self.notes = CoordinatorNotes(agent_id, worker.task.card.ref, worker.family, worker.layout)
        """The run's task card and the coordinator's refusal notices (``edge_agent.coordinator_notes``)."""
        self.secure = SecureParticipant(agent_id, worker.family, self.topics, self._publish_one, self._sealed,
                                        state if secagg_audit else None, settled=undo_if_left_out(state, worker.family),
                                        vanish_after=secagg_vanish_after, state=state)
        """Secure rounds' stages (``edge_agent.secure``)."""
        self.outbox = UpdateOutbox(agent_id, self.topics, self._publish_one, self._sealed, signing_key, max_message_bytes)
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        """(kind, item): ("message", (topic, payload, retained)), ("connected", None), ("trained", outcome),
        ("denied", Denial)."""
        self._link: MqttLink | None = None
        self._seen_announcement = False
        self._joined_mid_round: tuple[str, int] | None = None
        self._held: HeldUpdate | None = None
        self._trainer: TrainingThread | None = None
        """Started by ``run``; a loop driven message by message without it (unit tests) trains inline."""
        self._training: RoundAnnouncement | None = None
        """The round on the training thread now; no other is started until its outcome is handled."""
        self._privacy_before_round: PrivacySpent | None = None
        """The privacy spend when the round in training started: what heartbeats report meanwhile."""
        self._answered: tuple[str, int] | None = read_progress(state)

    # -- status ---------------------------------------------------------------------------
    def status(self, state: str = "online", *, will: bool = False) -> AgentStatus:
        """``budget_exhausted`` overrides ``state`` once the privacy budget is spent, even in the last will
        (``will``: sequence number 0, see ``edge_agent.freshness``)."""
        # While a round trains, its thread owns the worker, DP ledger included (it charges the round):
        # report the spend read when the round started rather than read the ledger while it changes.
        privacy = self._privacy_before_round if self._training is not None else self.worker.privacy_spent()
        if will and privacy is not None and not privacy.exhausted:
            privacy = None  # the will is built once: published after later rounds, its spend would look rolled back
        if privacy is not None and privacy.exhausted:
            state = "budget_exhausted"
        return AgentStatus(
            agent_id=self.agent_id, state=state, device=self.profile.name, family=self.worker.family,  # type: ignore[arg-type]
            num_samples=len(self.worker.data.train), num_eval_samples=len(self.worker.data.held_out),
            version=SOFTWARE_VERSION, timestamp=time.time(), session=self.session, privacy=privacy,
            reconnects=self._link.reconnects if self._link is not None else 0, rejected=sum(self.rejected.values()),
            denied=self._link.denials if self._link is not None else 0,
            task_ref=self.worker.task.card.ref, layout=self.worker.layout, problem=self.problem or self.notes.card_problem,
            label_counts=self.worker.label_counts, epoch=self.freshness.process_epoch,
            seq=0 if will else self.freshness.next_seq(), notice=self.notes.notice,
        )

    def _publish_status(self) -> None:
        assert self._link is not None
        self._link.publish(self.topics.agent_status(self.agent_id), self._sealed(encode_message(self.status())),
                           retain=True)

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> int:
        topics = self.topics
        if self._trust is OPEN:
            log.warning("no coordinator key pinned (--coordinator-key): this agent acts on any round announcement "
                        "on the broker, signed or not; enroll it to pin the coordinator's key")
        self._link = MqttLink(
            self.agent_id, self.broker,
            on_message=lambda topic, payload, retained: self._inbox.put(("message", (topic, payload, retained))),
            subscriptions=[(topics.coordinator_status, 1), (topics.rounds_current, 1), (topics.task, 1),
                           (topics.notices(self.agent_id), 1), (topics.global_states_of(self.worker.family), 1),
                           *self.secure.subscriptions()],
            will=Will(topics.agent_status(self.agent_id), self._sealed(encode_message(self.status("offline", will=True)))),
            backoff=self.backoff,
            on_connected=lambda connection: self._inbox.put(("connected", None)),
            on_denied=lambda denial: self._inbox.put(("denied", denial)),
        )
        self._trainer = TrainingThread(self.worker, lambda outcome: self._inbox.put(("trained", outcome)),
                                       name=f"{self.agent_id}-training").start()
        self._link.start()
        next_heartbeat = time.monotonic() + self.heartbeat_s
        exit_code = 0
        try:
            while not stop.is_set():
                wake = next_heartbeat if self._held is None else min(next_heartbeat, self._held.due)
                try:
                    kind, item = self._inbox.get(timeout=min(max(0.0, wake - time.monotonic()), 1.0))
                except queue.Empty:  # wakes at least every second to see ``stop``
                    kind, item = "timer", None
                if kind == "connected" or time.monotonic() >= next_heartbeat:
                    if self._link.connected:
                        self._publish_status()
                    next_heartbeat = time.monotonic() + self.heartbeat_s
                if kind == "message":
                    self._on_message(*item)
                elif kind == "trained":
                    self._on_trained(item)
                elif kind == "denied":  # the link logged the first refusal of its kind
                    if self._link.denials >= self.max_denials:
                        exit_code = give_up(self.agent_id, self._link.denials, item)
                        break
                    if self._link.connected:
                        self._publish_status()  # with the new ``denied`` count, for the coordinator
                if self._held is not None and time.monotonic() >= self._held.due:
                    self._release_held()
                if self._finished():
                    log.info("the coordinator finished the run; exiting")
                    break
        finally:
            self._trainer.close()
            if self._training is not None:
                log.info("stopping while round %d trains: not waiting for it, its update will not be sent",
                         self._training.round)
            if self._link.connected:
                self._link.publish(topics.agent_status(self.agent_id), self._sealed(encode_message(self.status("offline"))),
                                   retain=True)
            self._link.stop()
        return exit_code

    def _finished(self) -> bool:
        return self.exit_when_finished and self.coordinator is not None and self.coordinator.state == "finished"

    # -- messages -------------------------------------------------------------------------
    def _on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        try:
            parsed = self.topics.parse(topic)
            if parsed.kind == "coordinator_status" and payload:
                self._on_coordinator_status(decode_trusted(payload, CoordinatorStatus, _SMALL, self._trust).message)
            elif parsed.kind == "round" and payload:
                self._on_announcement(decode_trusted(payload, RoundAnnouncement, _SMALL, self._trust).message, retained)
            elif parsed.kind == "task" and payload:
                self._on_task(decode_trusted(payload, TaskAnnouncement, _SMALL, self._trust).message)
            elif parsed.kind in ("secagg_relay", "secagg_inbox") and payload:
                self.secure.on_message(parsed, payload, self._trust)
            elif parsed.kind == "notice" and payload:
                self._on_notice(topic, decode_trusted(payload, Notice, _SMALL, self._trust).message)
            elif parsed.kind == "global_state" and parsed.family == self.worker.family:
                # Some brokers (amqtt) also replay other families' retained states on connect;
                # states are keyed by round only, so a foreign one would shadow ours.
                if payload or parsed.chunk is None:  # an emptied chunk topic says nothing about the state
                    self._on_global_state(parsed.round, payload)  # type: ignore[arg-type]
        except ProtocolError as exc:
            self._drop(topic, exc.reason.value, exc.detail)
            return
        self._maybe_answer()

    def _drop(self, topic: str, reason: str, detail: str) -> None:
        """Count a dropped message; log the first of each reason (a flood must not flood the log)."""
        self.rejected[reason] += 1
        if self.rejected[reason] == 1:
            log.warning("dropped a message on %s: %s: %s (further drops for this reason are only counted)",
                        topic, reason, detail)

    def _fresh(self, topic: str, epoch: int, run_id: str, *, ends_run: bool = False) -> bool:
        """Whether to act on a coordinator message: not of an older epoch, and, if it ends a run, of this
        agent's run (``edge_agent.freshness``). A newer epoch is a new run: what older ones said is forgotten."""
        verdict = self.freshness.judge(epoch, run_id, ends_run=ends_run)
        if verdict.reason is not None:
            self._drop(topic, verdict.reason, verdict.detail)
            return False
        if verdict.advanced:
            log.info("following the coordinator's epoch %d (run %s)", epoch, run_id)
            if self.announcement is not None and self.announcement.epoch < epoch:
                self.announcement = None
            if self.coordinator is not None and self.coordinator.epoch < epoch:
                self.coordinator = None
            self.global_states.forget_before(epoch)
        return True

    def _on_coordinator_status(self, status: CoordinatorStatus) -> None:
        # An older run's "finished" or "offline" (a replay, or a run that ended) must not stop us.
        if self._fresh(self.topics.coordinator_status, status.epoch, status.run_id, ends_run=status.state != "online"):
            self.coordinator = status

    def _on_task(self, announcement: TaskAnnouncement) -> None:
        changed = self._fresh(self.topics.task, announcement.epoch, announcement.run_id) and self.notes.on_task(announcement)
        if changed and self._link is not None:
            self._publish_status()  # the coordinator learns at once why this agent stays out

    def _on_notice(self, topic: str, notice: Notice) -> None:
        if not self._fresh(topic, notice.epoch, notice.run_id):
            return
        before = self.notes.notice
        if not self.notes.on_notice(notice):
            self._drop(topic, "inconsistent", f"a notice to {notice.agent_id}")
        elif self.notes.notice != before and self._link is not None:
            self._publish_status()  # the operator reads the refusal in this agent's status too

    def _on_announcement(self, ann: RoundAnnouncement, retained: bool) -> None:
        if not self._fresh(self.topics.rounds_current, ann.epoch, ann.run_id):
            return
        refusal = announcement_refusal(ann, self.announcement, self._answered, time.time())
        if refusal is not None:
            self._drop(self.topics.rounds_current, *refusal)
            return
        if not self._seen_announcement:
            self._seen_announcement = True
            if retained and self.agent_id in ann.selected and self._answered != (ann.run_id, ann.round):
                # Selected before this process existed: its previous incarnation died mid-round.
                self._joined_mid_round = (ann.run_id, ann.round)
                log.info("started while round %d was in progress; joining from the next round", ann.round)
        self.announcement = ann
        self.secure.settle(ann)  # every announcement, selected or not: it tells a secure answer's fate
        self._check_agreement(ann)
        if self.problem is None and self.agent_id in ann.selected and self._joined_mid_round != (ann.run_id, ann.round):
            self.secure.begin(ann)
        self.outbox.resend_if_new_session(ann, self.coordinator)

    def _check_agreement(self, ann: RoundAnnouncement) -> None:
        """Refuse rounds this agent cannot run (``LocalWorker.refusal``); say so in status and log when that changes."""
        problem = self.worker.refusal(ann)
        if problem == self.problem:
            return
        self.problem = problem
        if problem is not None:
            log.warning("refusing rounds (task_mismatch): %s", problem)  # the coordinator counts it so
        else:
            log.info("round %d is of this agent's task and layout again", ann.round)
        if self._link is not None:
            self._publish_status()

    def _on_global_state(self, round_number: int, payload: bytes) -> None:
        if not payload:  # an emptied retained topic, which anyone may publish: keeping the newest two is cleanup enough
            return
        states = self.global_states
        message = states.assemble(round_number, payload)
        if message is None:  # more chunks to come
            return
        misfiled = states.misfiled(message, round_number)
        if misfiled is not None:
            self._drop(states.topic(round_number), "topic_mismatch", misfiled)
        elif self._fresh(states.topic(round_number), message.epoch, message.run_id):
            states.keep(message)  # an older run's would push out this run's: not kept

    # -- work -----------------------------------------------------------------------------
    def _maybe_answer(self) -> None:
        ann = self.announcement
        if ann is None or self.agent_id not in ann.selected or self._held is not None or self._training is not None:
            return
        if self.problem is not None:
            return
        if (ann.run_id, ann.round) in (self._answered, self._joined_mid_round):
            return
        ref = ann.states.get(self.worker.family)
        global_state = None
        if ref is not None:
            global_state = self.global_states.get(ref.round)
            if global_state is None or global_state.digest != ref.digest or global_state.run_id != ann.run_id:
                return  # wait for the state the round names
        self._privacy_before_round = self.worker.privacy_spent()
        self._training = ann
        if self._trainer is None:
            self._on_trained(train_round(self.worker, ann, global_state))
        else:
            self._trainer.submit(ann, global_state)

    def _on_trained(self, outcome: TrainingOutcome) -> None:
        """A round ended on the training thread: record it, send (or hold back) its update, take the next."""
        self._training = None  # the training thread is done with the worker: status reads it again
        self._settle(outcome)
        self._maybe_answer()  # a round announced while this one trained

    def _settle(self, outcome: TrainingOutcome) -> None:
        ann, update, error = outcome.announcement, outcome.update, outcome.error
        if isinstance(error, BudgetExhausted):
            log.warning("round %d not trained: %s; this agent stops training", ann.round, error)
            self._mark_answered(ann)
            self._publish_status()
            return
        if isinstance(error, (ProtocolError, PrivacyUnsupported)):
            log.error("cannot answer round %d: %s", ann.round, error)
            self._mark_answered(ann)
            return
        if error is not None:  # a bug: fail as loudly as when training ran on the loop's thread
            raise error
        assert update is not None
        self._mark_answered(ann)
        delay = self.straggler.sample(self.agent_id, ann.round) if ann.task == "train" else 0.0
        if delay > 0:
            log.info("round %d: straggling, holding the update back for %.1fs", ann.round, delay)
            self._held = HeldUpdate(update, time.monotonic() + delay)
            return
        self._send_update(update)

    def _release_held(self) -> None:
        assert self._held is not None
        update, self._held = self._held.update, None
        self._send_update(update)
        self._maybe_answer()  # a round announced meanwhile

    def _send_update(self, update: Update) -> None:
        if self.secure.takes(update):  # a secure round's: it leaves masked, through the stages
            self._say_if_spent(update)
            return
        self.outbox.send(update, self.coordinator)
        self._say_if_spent(update)

    def _say_if_spent(self, update: Update) -> None:
        """A spent budget goes out in the status at once, not at the next heartbeat: else the coordinator may
        select this agent again, and the round waits its deadline for an agent that will not train."""
        if update.privacy is not None and update.privacy.exhausted:
            log.warning("privacy budget spent (epsilon %.4g of %.4g): this agent stops training",
                        update.privacy.epsilon, update.privacy.budget_epsilon or 0.0)
            self._publish_status()

    def _sealed(self, payload: bytes) -> bytes:
        return payload if self.signing_key is None else encode_message(self.signing_key.seal(payload))

    def _publish_one(self, topic: str, payload: bytes) -> MQTTMessageInfo:
        """QoS 1: queued by paho while disconnected and sent (again) after the reconnect."""
        assert self._link is not None
        return self._link.publish(topic, payload, qos=1)

    def _mark_answered(self, ann: RoundAnnouncement) -> None:
        self._answered = (ann.run_id, ann.round)
        write_progress(self.state, ann.run_id, ann.round)
