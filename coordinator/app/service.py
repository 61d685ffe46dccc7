"""The coordinator process: the MQTT link, the engine's loop, and the HTTP endpoints."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.admission.intake import Opened
from coordinator.app.driver import EngineDriver
from coordinator.app.gate import SenderGate, sender_bounds
from coordinator.app.inbox import FairInbox
from coordinator.app.openers import UPDATE, Openers
from coordinator.round.engine import RoundEngine
from coordinator.settings import CoordinatorSettings
from coordinator.state.checkpoint import CheckpointStore
from coordinator.state.rounds import RoundSummary
from coordinator.state.rounds_log import RoundsLog
from coordinator.strategies import build_strategy
from coordinator.telemetry.http_server import HealthServer
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.transport.mqtt import Backoff, Connection, MqttLink, Will
from service_kit.keys import load_or_create_signing_key
from service_kit.state_claim import StateDirClaim

log = logging.getLogger(__name__)

STALL_S = 30.0
DRAIN_MAX = 1000
"""Messages handled between two ticks at most."""
INBOX_BYTES = 64 * 1024 * 1024
"""Payload bytes received but not yet handled; past this the network thread waits (see inbox.py)."""
WAKE = ("wake", None, None)
"""Control item: a round's closing job finished; the loop ticks next, to apply it without waiting for a poll."""


class CoordinatorService:
    def __init__(self, settings: CoordinatorSettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        settings.check_tls_contents()
        # Claimed before anything in it is read or written, the signing key included: a second coordinator on the
        # directory stops here. Held until ``run`` ends (a service runs once), or ``close`` for one that will not.
        self._claim = StateDirClaim(Path(settings.state_dir), "coordinator",
                                    "two coordinators on one would overwrite each other's checkpoint and rounds log")
        try:
            self._build(settings, registry)
        except BaseException:
            self._claim.release()
            raise

    def _build(self, settings: CoordinatorSettings, registry: CollectorRegistry | None) -> None:
        self.rounds_log = RoundsLog(Path(settings.state_dir) / "rounds.jsonl")
        self.metrics = CoordinatorMetrics(registry)
        # One thread aggregates and checkpoints while the loop keeps serving messages and health checks.
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aggregate")
        self.engine = RoundEngine(settings, build_strategy(settings), self.metrics,
                                  signing_key=load_or_create_signing_key(settings.signing_key_path))
        self.driver = EngineDriver(self.engine, self, CheckpointStore(settings.state_dir), background=self._background,
                                   on_round_closed=self._round_closed, on_resumed=self._resumed,
                                   on_job_done=lambda: self._inbox.put_control(WAKE))
        parts = self.engine.parts
        # Queued per sender and served in turn; what no enrolled agent sent is dropped before queueing (gate.py).
        self._gate = SenderGate(parts.topics, self.metrics, parts.enrollment)
        self._inbox = FairInbox(INBOX_BYTES, sender_bounds(settings.max_update_bytes,
                                                           parts.intake.status_limits.max_payload_bytes,
                                                           parts.intake.roster_limits.max_payload_bytes))
        # Updates are opened (signature, decoding, norm) on a small pool, handed over in the inbox's order.
        self._openers = Openers(self._inbox, parts.intake.open)
        self._link: MqttLink | None = None
        self._restored = False
        self._last_loop = time.monotonic()
        self.http = HealthServer(settings.http_host, settings.http_port, self.metrics.registry,
                                 self._healthy, self._ready)

    def close(self) -> None:
        """Let go of what the constructor took (the state directory's claim, the HTTP port), for a service that
        will not run; ``run`` does it when it ends."""
        self._claim.release()
        self.http.stop()

    # Outbox for the driver
    def publish(self, topic: str, payload: bytes, *, retain: bool) -> None:
        assert self._link is not None
        self._link.publish(topic, payload, qos=1, retain=retain)

    def run(self, stop: threading.Event) -> int:
        try:
            return self._run(stop)
        finally:
            self._claim.release()

    def _run(self, stop: threading.Event) -> int:
        self.driver.restore()
        self._restored = True
        self.http.start()
        log.info("serving /metrics, /healthz, /readyz on %s:%d", self.settings.http_host, self.http.port)
        topics = self.engine.parts.topics
        self._link = MqttLink(
            self.settings.mqtt_client_id, self.settings.broker_address(),
            on_message=lambda topic, payload, retained: self._received(topic, payload),
            subscriptions=[(topics.all_agent_status, 1), (topics.all_updates, 1), (topics.all_partials, 1),
                           (topics.all_site_rosters, 1),
                           *([(topics.all_secagg, 1)] if self.settings.secure_aggregation else [])],
            will=Will(topics.coordinator_status, self.engine.offline_status()),
            persistent_session=True,
            backoff=Backoff(self.settings.reconnect_min_s, self.settings.reconnect_max_s),
            on_connected=lambda connection: self._inbox.put_control(("connected", connection, None)),
            on_disconnected=lambda: self._inbox.put_control(("disconnected", None, None)),
            # The link logs the first refusal of each kind; the metric counts them all (thread-safe).
            on_denied=lambda denial: self.metrics.broker_denials.labels(denial.action).inc(),
        )
        self._link.start()
        try:
            self._loop(stop)
        finally:
            if not self.engine.finished and self._link.connected:
                self.publish(topics.coordinator_status, self.engine.offline_status(), retain=True)
            self._inbox.close()
            self._openers.close()
            self._link.stop()
            self.http.stop()
            self._background.shutdown(wait=True)
        return 0

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._last_loop = time.monotonic()
            wait = self.driver.tick()
            if self.engine.finished and self.settings.exit_when_finished:
                return
            taken = self._openers.next(timeout=wait)
            handled = 0
            while taken is not None:  # drain what else arrived before ticking again (deadlines wait for no backlog)
                if taken[0] is WAKE:
                    break
                self._dispatch(*taken)
                handled += 1
                taken = self._openers.next(timeout=0) if handled < DRAIN_MAX else None

    def _received(self, topic: str, payload: bytes) -> None:
        """On the network thread: queue a message under its sender, unless the gate or the sender's bound drops it."""
        parsed = self._gate.admit(topic, payload)
        kind = UPDATE if parsed is not None and parsed.kind == "update" else "message"
        if parsed is not None and not self._inbox.put((kind, topic, payload), len(payload),
                                                      sender=self._gate.sender_of(parsed, payload), lane=parsed.kind):
            self._gate.over_bound(parsed, payload, self._inbox.bounds.get(parsed.kind))

    def _dispatch(self, item: tuple[str, object, object], opened: Opened | None = None) -> None:
        kind, first, second = item
        if kind in ("message", UPDATE):
            self.driver.on_message(first, second, opened)  # type: ignore[arg-type]
        elif kind == "connected":
            assert isinstance(first, Connection)
            if first.reconnect:
                self.metrics.reconnects.inc()
                log.info("reconnected to the broker (session %s)", "kept" if first.session_present else "lost")
            self.driver.on_connection(True, first.session_present)
        elif kind == "disconnected":
            if self.engine.connected:  # paho may report one loss twice
                log.warning("lost the broker connection")
            self.driver.on_connection(False)

    def _round_closed(self, summary: RoundSummary) -> None:
        self.rounds_log.append(summary)

    def _resumed(self, last: RoundSummary | None) -> None:
        self.rounds_log.reconcile(last)

    def _healthy(self) -> tuple[bool, str]:
        stalled = time.monotonic() - self._last_loop
        return (stalled < STALL_S, f"loop last ran {stalled:.1f}s ago")

    def _ready(self) -> tuple[bool, str]:
        if not self._restored:
            return False, "checkpoint not loaded"
        if self._link is None or not self._link.connected:
            return False, "broker not connected"
        return True, "ready"
