"""The edge agent's main loop: hear announcements, fetch global state, train, publish.

MQTT callbacks only enqueue; this loop does the work on one thread, so training never
blocks the network thread (keep-alives and acknowledgements keep flowing).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from edge_agent.profiles import DeviceProfile
from edge_agent.state import AgentStateDir
from edge_agent.worker import LocalWorker
from protocol.chunking import Reassembler, split_payload
from protocol.errors import ProtocolError
from protocol.limits import DecodeLimits
from protocol.messages import AgentStatus, Chunk, CoordinatorStatus, GlobalState, RoundAnnouncement, Update
from protocol.mqtt import BrokerAddress, MqttLink, Will
from protocol.topics import Topics
from protocol.version import SOFTWARE_VERSION
from protocol.wire import decode_message, encode_message

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
        state_limits: DecodeLimits | None = None,
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
        self.state_limits = state_limits or DecodeLimits()
        self.announcement: RoundAnnouncement | None = None
        self.global_states: dict[int, GlobalState] = {}
        self.coordinator: CoordinatorStatus | None = None
        self.rounds_answered = 0
        self._reassembler = Reassembler(max_transfers=4)
        self._inbox: queue.Queue[tuple[str, str, bytes]] = queue.Queue()
        self._link: MqttLink | None = None
        progress = state.read_json("progress") or {}
        self._answered: tuple[str, int] | None = (
            (progress["run_id"], int(progress["round"])) if "run_id" in progress else None)

    # -- status ---------------------------------------------------------------------------
    def status(self, state: str = "online") -> AgentStatus:
        return AgentStatus(
            agent_id=self.agent_id, state=state, device=self.profile.name, family=self.worker.family,  # type: ignore[arg-type]
            num_samples=len(self.worker.data.train), num_eval_samples=len(self.worker.data.held_out),
            version=SOFTWARE_VERSION, timestamp=time.time(),
        )

    def _publish_status(self) -> None:
        assert self._link is not None
        self._link.publish(self.topics.agent_status(self.agent_id), encode_message(self.status()), retain=True)

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> int:
        topics = self.topics
        self._link = MqttLink(
            self.agent_id, self.broker,
            on_message=lambda topic, payload, retained: self._inbox.put(("message", topic, payload)),
            subscriptions=[(topics.coordinator_status, 1), (topics.rounds_current, 1),
                           (topics.global_states_of(self.worker.family), 1)],
            will=Will(topics.agent_status(self.agent_id), encode_message(self.status("offline"))),
            on_connected=lambda again: self._inbox.put(("connected", "", b"")),
        )
        self._link.start()
        next_heartbeat = time.monotonic() + self.heartbeat_s
        try:
            while not stop.is_set():
                try:
                    kind, topic, payload = self._inbox.get(timeout=max(0.0, next_heartbeat - time.monotonic()))
                except queue.Empty:
                    kind = "heartbeat"
                if kind == "connected" or kind == "heartbeat":
                    if self._link.connected:
                        self._publish_status()
                    next_heartbeat = time.monotonic() + self.heartbeat_s
                elif kind == "message":
                    self._on_message(topic, payload)
                if self._finished():
                    log.info("the coordinator finished the run; exiting")
                    break
        finally:
            if self._link.connected:
                self._link.publish(topics.agent_status(self.agent_id), encode_message(self.status("offline")),
                                   retain=True)
            self._link.stop()
        return 0

    def _finished(self) -> bool:
        return self.exit_when_finished and self.coordinator is not None and self.coordinator.state == "finished"

    # -- messages -------------------------------------------------------------------------
    def _on_message(self, topic: str, payload: bytes) -> None:
        try:
            parsed = self.topics.parse(topic)
            if parsed.kind == "coordinator_status" and payload:
                self.coordinator = decode_message(payload, CoordinatorStatus, _SMALL)
            elif parsed.kind == "round" and payload:
                self.announcement = decode_message(payload, RoundAnnouncement, _SMALL)
            elif parsed.kind == "global_state" and parsed.family == self.worker.family:
                # Some brokers (amqtt) also replay other families' retained states on connect;
                # states are keyed by round only, so a foreign one would shadow ours.
                self._on_global_state(parsed.round, payload)  # type: ignore[arg-type]
        except ProtocolError as exc:
            log.warning("dropped a message on %s: %s", topic, exc)
            return
        self._maybe_answer()

    def _on_global_state(self, round_number: int, payload: bytes) -> None:
        if not payload:
            self.global_states.pop(round_number, None)
            return
        message = decode_message(payload, None, self.state_limits)
        if isinstance(message, Chunk):
            whole = self._reassembler.add("coordinator", message)
            if whole is None:
                return
            message = decode_message(whole, GlobalState, self.state_limits)
        if not isinstance(message, GlobalState) or message.round != round_number:
            log.warning("ignored a global state that does not match its topic")
            return
        self.global_states[round_number] = message
        for stale in sorted(self.global_states)[:-2]:  # keep the newest two
            del self.global_states[stale]

    # -- work -----------------------------------------------------------------------------
    def _maybe_answer(self) -> None:
        ann = self.announcement
        if ann is None or self.agent_id not in ann.selected or self._answered == (ann.run_id, ann.round):
            return
        ref = ann.states.get(self.worker.family)
        global_state = None
        if ref is not None:
            global_state = self.global_states.get(ref.round)
            if global_state is None or global_state.digest != ref.digest or global_state.run_id != ann.run_id:
                return  # wait for the state the round names
        try:
            update = self.worker.answer(ann, global_state)
        except ProtocolError as exc:
            log.error("cannot answer round %d: %s", ann.round, exc)
            self._mark_answered(ann)
            return
        self._publish_update(update)
        self._mark_answered(ann)
        self.rounds_answered += 1
        log.info("round %d (%s): sent %s, held-out accuracy of the global model %.3f", ann.round, ann.task,
                 "weights" if update.weights else "delta" if update.delta
                 else "prototypes" if update.prototypes is not None else "metrics",
                 update.metrics.eval_accuracy or 0.0)

    def _publish_update(self, update: Update) -> None:
        assert self._link is not None
        payload = encode_message(update)
        topic = self.topics.update(self.agent_id, update.round)
        for piece in split_payload(payload, self.max_message_bytes or len(payload)):
            self._link.publish(topic, piece, qos=1)

    def _mark_answered(self, ann: RoundAnnouncement) -> None:
        self._answered = (ann.run_id, ann.round)
        self.state.write_json("progress", {"run_id": ann.run_id, "round": ann.round})
