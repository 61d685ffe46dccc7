"""Lightweight, protocol-correct simulated agents for load tests: many per process, no torch.

Each simulated agent does on the wire what ``edge_agent/agent.py`` does: a retained
``AgentStatus`` (and heartbeats) naming its task and the layout fingerprint of the arrays it
sends, the round announcement, the global state of its family, and an ``Update`` on
``updates/{id}/{round}`` with the round's run id, task and base digest: ``weights`` when the
family bootstraps (the seeded init, alike for all, as untrained agents propose it), a ``delta``
afterwards, metrics only for ``evaluate``.

Why not one MQTT connection per agent: 10,000 paho clients (threads, sockets) would swamp a
small machine and measure the fleet, not the coordinator. One subscriber hears the
announcement and the state once for every agent of the process; a few publisher connections
send the agents' messages. The bench broker has no ACL, so any connection may publish for any
agent. Payloads are built once per (round, variant) and only the agent id is patched in per
agent (same length, so the msgpack framing and array alignment stay valid): the bytes are
exactly what ``encode_message`` gives for that agent's update (checked on the first one), and
the fleet's own CPU stays small next to the coordinator's. Deltas are small seeded float32
noise, so the global model stays finite over many rounds.

The raw transport baseline (a round's updates replayed to a bare subscriber) is raw_transport.py.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from protocol.arrays import layout_of
from protocol.errors import ProtocolError
from protocol.limits import DEFAULT_LIMITS, DecodeLimits
from protocol.messages import (
    AgentStatus,
    CoordinatorStatus,
    GlobalState,
    RoundAnnouncement,
    TaskRef,
    TrainMetrics,
    Update,
)
from protocol.security.trust import OPEN, decode_trusted
from protocol.tasks import BUILTIN_CARDS, layout_fingerprint
from protocol.topics import Topics
from protocol.transport.chunking import Reassembler, receive
from protocol.transport.mqtt import BrokerAddress
from protocol.transport.sockets import disable_nagle
from protocol.version import SOFTWARE_VERSION
from protocol.wire import decode_message, encode_message

WINDOW_BYTES = 32 * 1024 * 1024
"""Unacknowledged bytes per publisher: the fleet never holds more than this per connection."""
WINDOW_MESSAGES = 1000
VARIANTS = 8
_STATE_LIMITS = DecodeLimits()
"""Global states carry whole models: the default (large) bounds."""
"""Distinct random deltas per round; agents take turns (krum and the median see distinct updates)."""


def model_layout(num_params: int) -> dict[str, tuple[int, ...]]:
    """Four float32 arrays shaped like a small CNN's parameters, ``num_params`` (at least 1,000) in total."""
    bias = min(1000, num_params // 10)
    conv = num_params * 3 // 10 // 288 * 288
    fc = num_params * 6 // 10 // bias * bias
    return {"features.0.weight": (conv // 288, 32, 3, 3), "classifier.0.weight": (fc // bias, bias),
            "classifier.0.bias": (bias,), "head.weight": (num_params - conv - fc - bias,)}


def agent_ids(count: int, prefix: str = "sim") -> list[str]:
    """Same-length ids, so one encoded payload serves every agent (see the module docstring)."""
    return [f"{prefix}-{i:05d}" for i in range(count)]


class Publisher:
    """One paho connection, written to by exactly one thread (this one's worker); its network loop
    runs on paho's own thread (``loop_start``), which never writes from a caller's thread."""

    def __init__(self, name: str, address: BrokerAddress) -> None:
        self.name = name
        client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=name, clean_session=True,
                             protocol=paho.MQTTv311)
        client.max_inflight_messages_set(WINDOW_MESSAGES + 100)
        client.max_queued_messages_set(0)
        client.on_publish = self._on_publish
        client.on_connect = self._on_connect
        self._connected = threading.Event()
        self.client = client
        self.address = address
        self.jobs: queue.Queue[Callable[[Publisher], None] | None] = queue.Queue()
        self._cond = threading.Condition()
        self._pending: dict[int, tuple[int, bool]] = {}
        self._early: set[int] = set()
        self._outstanding = 0
        self.acked = 0
        """Counted messages (updates) the broker acknowledged (PUBACK) on this connection so far."""
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._work, name=f"pub-{name}", daemon=True)

    def _on_connect(self, client: paho.Client, *args: object) -> None:
        disable_nagle(client)  # as the system's own links do (protocol/transport/sockets.py)
        self._connected.set()

    def start(self) -> None:
        self.client.connect(self.address.host, self.address.port, keepalive=60)
        self.client.loop_start()
        if not self._connected.wait(30):
            raise RuntimeError(f"publisher {self.name} could not connect to {self.address}")
        self._thread.start()

    def _on_publish(self, client: paho.Client, userdata: object, mid: int, reason: object, props: object) -> None:
        with self._cond:
            entry = self._pending.pop(mid, None)
            if entry is None:
                self._early.add(mid)  # acknowledged before publish() returned to the worker
            else:
                self._outstanding -= entry[0]
                self.acked += entry[1]
            self._cond.notify_all()

    def publish(self, topic: str, payload: bytes, *, retain: bool = False, count: bool = False) -> None:
        """Worker thread only. Blocks while the window is full; ``count``: add its PUBACK to ``acked``."""
        with self._cond:
            while (self._outstanding >= WINDOW_BYTES or len(self._pending) >= WINDOW_MESSAGES) \
                    and not self.stopping.is_set():
                self._cond.wait(0.5)
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        with self._cond:
            if info.mid in self._early:
                self._early.discard(info.mid)
                self.acked += count
            else:
                self._pending[info.mid] = (len(payload), count)
                self._outstanding += len(payload)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every message published so far is acknowledged."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending and time.monotonic() < deadline:
                self._cond.wait(0.2)
            return not self._pending

    def _work(self) -> None:
        while not self.stopping.is_set():
            try:
                job = self.jobs.get(timeout=0.5)
            except queue.Empty:
                continue
            if job is None:
                return
            try:
                job(self)
            except Exception as exc:  # noqa: BLE001 - reported by LightFleet.errors; the worker goes on
                self.errors.append(f"{self.name}: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self.stopping.set()
        self.jobs.put(None)
        self._thread.join(10)
        self.client.disconnect()
        self.client.loop_stop()


@dataclass
class FleetStats:
    rounds_answered: list[int] = field(default_factory=list)
    update_sizes: dict[int, list[list[int]]] = field(default_factory=dict)
    """round -> per publisher, the sizes of the updates it sent."""
    sent: dict[int, tuple[list[bytes], list[list[tuple[int, str]]]]] = field(default_factory=dict)
    """The last rounds' templates and, per publisher, the (index, agent) it sent them for: the raw baseline sends
    the same messages, built the same way (``LightFleet.replay_messages``)."""
    errors: list[str] = field(default_factory=list)


class LightFleet:
    """``count`` simulated agents of one model family in this process, on ``publishers`` connections.

    They say they run ``task`` (the coordinator's default, digits, unless told another); its real
    models are not what they send, but the coordinator checks only that a family's updates have
    the layout its agents report.
    """

    def __init__(self, url: str, federation: str, count: int, num_params: int, *, family: str = "bench",
                 task: TaskRef = BUILTIN_CARDS["digits"].ref, publishers: int = 4, heartbeat_s: float = 30.0,
                 seed: int = 0) -> None:
        self.address = BrokerAddress.parse(url)
        self.topics = Topics(federation)
        self.ids = agent_ids(count)
        self._placeholder = _placeholder(self.ids[0]).encode()
        """What each template carries in place of the agent id (the first's length: every id has it)."""
        self.layout = model_layout(num_params)
        self.fingerprint = layout_fingerprint(layout_of({n: np.zeros(s, np.float32) for n, s in self.layout.items()}))
        """The layout fingerprint of the arrays the agents send, as their statuses report it."""
        self.task = task
        self.family = family
        self.heartbeat_s = heartbeat_s
        self.seed = seed
        self.session = f"light{seed}"
        self.publishers = [Publisher(f"{federation}-pub{i}", self.address) for i in range(max(1, min(publishers, count)))]
        self.share = {p.name: self.ids[i::len(self.publishers)] for i, p in enumerate(self.publishers)}
        self.stats = FleetStats()
        self.coordinator: CoordinatorStatus | None = None
        self._announcement: RoundAnnouncement | None = None
        self._states: dict[int, GlobalState] = {}
        self._answered: set[tuple[str, int]] = set()
        self._reassembler = Reassembler(max_transfers=4)
        self._lock = threading.Lock()
        self._inbox: queue.Queue[tuple[str, bytes] | None] = queue.Queue()
        self._stop = threading.Event()
        self._subscriber = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2,
                                       client_id=f"{federation}-sub", clean_session=True, protocol=paho.MQTTv311)
        self._subscriber.on_connect = self._on_connect
        self._subscriber.on_message = lambda c, u, m: self._inbox.put((m.topic, m.payload))
        self._brain = threading.Thread(target=self._think, name="lightfleet", daemon=True)

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> LightFleet:
        """Connect, say hello for every agent (retained status), then listen for rounds."""
        for publisher in self.publishers:
            publisher.start()
            publisher.jobs.put(self._heartbeats)
        self._subscriber.connect(self.address.host, self.address.port, keepalive=60)
        self._subscriber.loop_start()
        self._brain.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._brain.join(10)
        self._subscriber.disconnect()
        self._subscriber.loop_stop()
        for publisher in self.publishers:
            publisher.stop()

    @property
    def errors(self) -> list[str]:
        """What went wrong so far: messages it could not handle, jobs that failed."""
        return self.stats.errors + [e for p in self.publishers for e in p.errors]

    @property
    def acked(self) -> int:
        return sum(p.acked for p in self.publishers)

    def drain(self, timeout_s: float) -> bool:
        return all(p.drain(timeout_s) for p in self.publishers)

    def _status(self, agent_id: str, index: int) -> bytes:
        return encode_message(AgentStatus(
            agent_id=agent_id, state="online", device="cpu", family=self.family, num_samples=100 + index % 50,
            num_eval_samples=20, version=SOFTWARE_VERSION, timestamp=time.time(), session=self.session,
            task_ref=self.task, layout=self.fingerprint))

    def _heartbeats(self, publisher: Publisher) -> None:
        for i, agent_id in enumerate(self.share[publisher.name]):
            publisher.publish(self.topics.agent_status(agent_id), self._status(agent_id, i), retain=True)
        timer = threading.Timer(self.heartbeat_s, lambda: publisher.jobs.put(self._heartbeats))
        timer.daemon = True
        if not self._stop.is_set():
            timer.start()

    # -- hearing the coordinator ---------------------------------------------------------
    def _on_connect(self, client: paho.Client, userdata: object, flags: object, reason: object, props: object) -> None:
        disable_nagle(client)
        t = self.topics
        client.subscribe([(t.coordinator_status, 1), (t.rounds_current, 1), (t.global_states_of(self.family), 1)])

    def _think(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            topic, payload = item
            try:
                self._on_message(topic, payload)
            except (ProtocolError, ValueError) as exc:
                self.stats.errors.append(f"{topic}: {exc}")

    def _on_message(self, topic: str, payload: bytes) -> None:
        parsed = self.topics.parse(topic)
        if parsed.kind == "coordinator_status" and payload:
            self.coordinator = decode_trusted(payload, CoordinatorStatus, DEFAULT_LIMITS, OPEN).message
        elif parsed.kind == "round" and payload:
            self._announcement = decode_trusted(payload, RoundAnnouncement, DEFAULT_LIMITS, OPEN).message
        elif parsed.kind == "global_state" and parsed.family == self.family and parsed.round is not None:
            if not payload:
                self._states.pop(parsed.round, None)
                return
            received = receive(payload, "coordinator", GlobalState, self._reassembler, _STATE_LIMITS)
            if received is None:
                return
            self._states[parsed.round] = received.message
            for stale in sorted(self._states)[:-2]:
                del self._states[stale]
        self._maybe_answer()

    def _maybe_answer(self) -> None:
        ann = self._announcement
        if ann is None or (ann.run_id, ann.round) in self._answered:
            return
        ref = ann.states.get(self.family)
        state = None
        if ref is not None:
            state = self._states.get(ref.round)
            if state is None or state.digest != ref.digest or state.run_id != ann.run_id:
                return  # wait for the state the round names
        selected = set(ann.selected)
        self._answered.add((ann.run_id, ann.round))  # first: a round that cannot be answered is not retried
        templates = self._templates(ann, state)
        self.stats.rounds_answered.append(ann.round)
        sizes: list[list[int]] = [[] for _ in self.publishers]
        self.stats.update_sizes[ann.round] = sizes
        shares = [[(i, a) for i, a in enumerate(self.share[p.name]) if a in selected] for p in self.publishers]
        self.stats.sent[ann.round] = (templates, shares)
        for stale in sorted(self.stats.sent)[:-2]:  # a round's templates are a few MB: keep the last two
            del self.stats.sent[stale]
        for k, publisher in enumerate(self.publishers):
            publisher.jobs.put(lambda p, k=k: self._send(p, ann.round, templates, shares[k], sizes[k]))

    def _templates(self, ann: RoundAnnouncement, state: GlobalState | None) -> list[bytes]:
        """One encoded update per variant, with the placeholder agent id ``self.ids[0]``'s length."""
        rng = np.random.default_rng([self.seed, ann.round])
        common = dict(run_id=ann.run_id, agent_id=_placeholder(self.ids[0]), round=ann.round, task=ann.task,
                      task_ref=self.task, family=self.family, base_digest=state.digest if state is not None else None)
        eval_metrics = dict(eval_loss=0.5, eval_accuracy=0.5, num_eval_samples=20)
        out = []
        for variant in range(VARIANTS):
            if ann.task == "evaluate":
                update = Update(**common, num_samples=100, metrics=TrainMetrics(**eval_metrics))
            else:
                if state is None:  # bootstrap: the untrained seeded init, byte for byte alike for every agent
                    # (the coordinator adopts the proposal a strict majority sent; distinct ones never start the run)
                    init = np.random.default_rng(ann.init_seed)
                    arrays = {n: 0.05 * init.standard_normal(s, dtype=np.float32) for n, s in self.layout.items()}
                else:
                    arrays = {n: (0.001 * rng.standard_normal(s, dtype=np.float32)) for n, s in self.layout.items()}
                payload = {"weights": arrays} if state is None else {"delta": arrays}
                if ann.algorithm == "scaffold":  # a control delta per parameter (zero before any training)
                    payload["control_delta"] = {n: (np.zeros(s, np.float32) if state is None else
                                                    0.01 * rng.standard_normal(s, dtype=np.float32))
                                                for n, s in self.layout.items()}
                metrics = TrainMetrics(**eval_metrics, train_loss=0.4, train_accuracy=0.6, duration_s=0.01, steps=1)
                update = Update(**common, num_samples=100 + variant, metrics=metrics, **payload)  # type: ignore[arg-type]
            out.append(encode_message(update))
        return out

    def replay_messages(self, round_number: int) -> list[Callable[[], Iterator[bytes]]]:
        """Per publisher, the updates it sent in ``round_number``, each built again as ``_send`` built it (the
        template patched with the agent's id: a fresh copy): the raw baseline's fleet does the same work."""
        templates, shares = self.stats.sent[round_number]
        return [lambda mine=mine: (self._payload(templates, i, agent_id) for i, agent_id in mine) for mine in shares]

    def _payload(self, templates: list[bytes], index: int, agent_id: str) -> bytes:
        return templates[index % len(templates)].replace(self._placeholder, agent_id.encode(), 1)

    def _send(self, publisher: Publisher, round_number: int, templates: list[bytes], mine: list[tuple[int, str]],
              sizes: list[int]) -> None:
        checked = False
        for i, agent_id in mine:
            if publisher.stopping.is_set():
                return
            payload = self._payload(templates, i, agent_id)
            if not checked:  # the patched bytes decode to this agent's update
                decoded = decode_message(payload, Update)
                assert decoded.agent_id == agent_id and decoded.round == round_number, decoded.agent_id
                checked = True
            publisher.publish(self.topics.update(agent_id, round_number), payload, count=True)
            sizes.append(len(payload))


def _placeholder(agent_id: str) -> str:
    return "Z" * len(agent_id)
