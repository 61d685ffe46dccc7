"""``coordinator site``: the site aggregator process, connected to its site's broker (bridged to the root's)."""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.sites.engine import SiteEngine
from coordinator.sites.settings import SiteSettings
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.security.signing import PublicKey
from protocol.transport.mqtt import Backoff, Connection, MqttLink
from service_kit.keys import load_or_create_signing_key

log = logging.getLogger(__name__)

CONNECTED = ("", b"")
"""Put in the inbox when the link (re)connects: the engine hears of it on its own thread, in order."""


def coordinator_key(path: Path | None) -> PublicKey | None:
    if path is None:
        log.warning("no --coordinator-key: the root's announcements are taken unverified")
        return None
    return PublicKey.from_text(path.read_text())


class SiteService:
    def __init__(self, settings: SiteSettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.metrics = CoordinatorMetrics(registry)
        self.engine = SiteEngine(settings, self.metrics, signing_key=load_or_create_signing_key(settings.signing_key_path),
                                 coordinator_key=coordinator_key(settings.coordinator_key))
        self._inbox: queue.Queue[tuple[str, bytes]] = queue.Queue(maxsize=100_000)
        self._link: MqttLink | None = None

    def run(self, stop: threading.Event) -> int:
        topics = self.engine.topics
        self._link = MqttLink(
            self.settings.mqtt_client_id, self.settings.broker_address(),
            on_message=lambda topic, payload, retained: self._inbox.put((topic, payload)),
            subscriptions=[(topics.rounds_current, 1), (topics.all_agent_status, 1), (topics.all_updates, 1),
                           (topics.site_resync(self.settings.site_id), 1)],
            persistent_session=True, backoff=Backoff(self.settings.reconnect_min_s, self.settings.reconnect_max_s),
            on_connected=self._connected)
        self._link.start()
        log.info("site %s: aggregating for federation %s", self.settings.site_id, self.settings.federation)
        try:
            while not stop.is_set():
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
        return 0

    def _connected(self, connection: Connection) -> None:
        log.info("site %s: connected to %s (session present: %s)", self.settings.site_id, self.settings.broker_address(),
                 connection.session_present)
        self._inbox.put(CONNECTED)

    def _publish(self, out: list[tuple[str, bytes]]) -> None:
        assert self._link is not None
        for topic, payload in out:
            self._link.publish(topic, payload, qos=1, retain=False)
