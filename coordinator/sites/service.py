"""``coordinator site``: the site aggregator process, connected to its site's broker (bridged to the root's)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.sites.engine import SiteEngine
from coordinator.sites.settings import SiteSettings
from coordinator.telemetry.http_server import HealthServer
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.security.signing import PublicKey
from protocol.transport.mqtt import Backoff, Connection, MqttLink
from service_kit.keys import load_or_create_signing_key
from service_kit.startup import CannotStart

log = logging.getLogger(__name__)

STALL_S = 30.0
"""/healthz fails when the loop has not run for this long."""
CONNECTED = ("", b"")
"""Put in the inbox when the link (re)connects: the engine hears of it on its own thread, in order."""


def coordinator_key(path: Path | None) -> PublicKey | None:
    if path is None:
        log.warning("no --coordinator-key: the root's announcements are taken unverified")
        return None
    try:  # read at start-up (not as a settings check: the charts' tests resolve paths of secrets not mounted there)
        return PublicKey.from_text(path.read_text())
    except OSError as exc:
        raise CannotStart(f"coordinator_key {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CannotStart(f"coordinator_key {path} is not the root's public key file (ed25519:...): {exc}") from None


class SiteService:
    def __init__(self, settings: SiteSettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        settings.check_tls_contents()
        self.metrics = CoordinatorMetrics(registry)
        self.engine = SiteEngine(settings, self.metrics, signing_key=load_or_create_signing_key(settings.signing_key_path),
                                 coordinator_key=coordinator_key(settings.coordinator_key))
        self._inbox: queue.Queue[tuple[str, bytes]] = queue.Queue(maxsize=100_000)
        self._link: MqttLink | None = None
        self._last_loop = time.monotonic()
        self.http: HealthServer | None = None
        if settings.http_port is not None:
            self.http = HealthServer(settings.http_host, settings.http_port, self.metrics.registry, self._healthy,
                                     self._ready)

    def run(self, stop: threading.Event) -> int:
        topics = self.engine.topics
        self._link = MqttLink(
            self.settings.mqtt_client_id, self.settings.broker_address(),
            on_message=lambda topic, payload, retained: self._inbox.put((topic, payload)),
            subscriptions=[(topics.rounds_current, 1), (topics.coordinator_status, 1), (topics.all_agent_status, 1),
                           (topics.all_updates, 1),
                           (topics.all_secagg, 1),
                           (topics.site_resync(self.settings.site_id), 1)],
            persistent_session=True, backoff=Backoff(self.settings.reconnect_min_s, self.settings.reconnect_max_s),
            on_connected=self._connected)
        self._link.start()
        log.info("site %s: aggregating for federation %s", self.settings.site_id, self.settings.federation)
        if self.http is not None:
            self.http.start()
            log.info("site %s: serving /metrics, /healthz, /readyz on %s:%d", self.settings.site_id,
                     self.settings.http_host, self.http.port)
        try:
            while not stop.is_set():
                self._last_loop = time.monotonic()
                wait, out = self.engine.tick()
                self._publish(out)
                try:
                    item = self._inbox.get(timeout=max(0.01, wait))
                except queue.Empty:
                    continue
                if item is CONNECTED:
                    self.engine.connected()
                    continue
                self._publish(self.engine.on_message(*item))
        finally:
            self._link.stop()
            if self.http is not None:
                self.http.stop()
        return 0

    def _healthy(self) -> tuple[bool, str]:
        stalled = time.monotonic() - self._last_loop
        return stalled < STALL_S, f"loop last ran {stalled:.1f}s ago"

    def _ready(self) -> tuple[bool, str]:
        connected = self._link is not None and self._link.connected
        return connected, "ready" if connected else "site broker not connected"

    def _connected(self, connection: Connection) -> None:
        log.info("site %s: connected to %s (session present: %s)", self.settings.site_id, self.settings.broker_address(),
                 connection.session_present)
        self._inbox.put(CONNECTED)

    def _publish(self, out: list[tuple[str, bytes]]) -> None:
        assert self._link is not None
        for topic, payload in out:
            self._link.publish(topic, payload, qos=1, retain=False)
