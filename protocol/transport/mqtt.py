"""The MQTT session both sides use: paho-mqtt 2.x with our reconnect policy.

* MQTT 5: the broker answers each QoS 1 publish and each subscription with a reason code, so one
  it refuses (an ACL's 0x87 "Not authorized") is seen, logged and counted (``acks.py``). With
  ``mqtt_version`` auto, a broker that refuses MQTT 5 ("unsupported protocol version": amqtt)
  gets MQTT 3.1.1, where a refused publish is acknowledged like any other and cannot be seen;
* sessions: agents start clean; the coordinator's session is persistent and never expires
  (clean start false, session expiry "never", as clean_session false is in 3.1.1), so the
  broker keeps its subscriptions and queued QoS 1 messages across disconnects and restarts;
* subscriptions are (re)made in ``on_connect``, so they survive reconnects;
* reconnects back off exponentially with full jitter, so a fleet that lost its broker
  does not reconnect in lock-step;
* the in-flight window is raised (paho's default of 20 throttles QoS 1 to tens of
  messages a second on loopback);
* callbacks run on the network thread and must only hand work over (e.g. to a queue);
* incoming payloads are copied once, not six times (``lean_publish.py``);
* one writer per socket: ``publish`` may be called from any thread, but only the network
  thread writes to the socket. paho writes straight from the caller's thread when it runs
  no loop thread of its own, and two writers interleave the bytes of large messages.
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from protocol.transport.acks import AckTracker, Denial
from protocol.transport.address import BrokerAddress as BrokerAddress
from protocol.transport.address import check_tls_file as check_tls_file
from protocol.transport.address import check_tls_files as check_tls_files
from protocol.transport.address import tls_file_setting as tls_file_setting
from protocol.transport.lean_publish import LeanClient, lean_supported
from protocol.transport.sockets import disable_nagle

log = logging.getLogger(__name__)

MessageHandler = Callable[[str, bytes, bool], None]
"""(topic, payload, retained) -> None, called on the network thread."""

SESSION_NEVER_EXPIRES = 0xFFFFFFFF
"""MQTT 5 session expiry interval meaning "never" (what clean_session false gives in 3.1.1)."""
UNSUPPORTED_PROTOCOL_VERSION = 0x84
SESSION_TAKEN_OVER = 0x8E
"""MQTT 5 DISCONNECT reason: another connection with the same client id replaced this one."""
"""CONNACK of a broker that does not speak the version asked for (paho maps 3.1.1's code 1 to it)."""
BLIND_311 = ("a publish the broker refuses (an ACL denial) is acknowledged like any other there, so this client "
             "cannot see it (only the broker's log shows it)")


class Backoff:
    """Exponential back-off with full jitter: uniform(0, min(cap, base * 2**attempt))."""

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2 ** min(self.attempt, 30)))
        self.attempt += 1
        return self._rng.uniform(0.0, ceiling)

    def reset(self) -> None:
        self.attempt = 0


@dataclass(frozen=True)
class Connection:
    """What ``on_connected`` learns about each successful connect."""

    reconnect: bool
    """False for the first connect of this link, True for every later one."""
    session_present: bool
    """The broker still held this client's persistent session (subscriptions and queued QoS 1 messages)."""


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes
    retain: bool = True


def _acknowledged(info: paho.MQTTMessageInfo) -> bool:
    try:
        return info.is_published()
    except (RuntimeError, ValueError):  # it failed for good: nothing to wait for
        return True


def _no_write_from_caller(client: paho.Client, userdata: object, sock: object) -> None:
    """paho's write hook: writes stay on the network thread, which wakes on its own socket pair."""


class MqttLink:
    """One MQTT client with its own network thread."""

    def __init__(
        self,
        client_id: str,
        address: BrokerAddress,
        on_message: MessageHandler,
        *,
        subscriptions: list[tuple[str, int]] | None = None,
        will: Will | None = None,
        persistent_session: bool = False,
        keepalive_s: int = 30,
        max_inflight: int = 1000,
        backoff: Backoff | None = None,
        on_connected: Callable[[Connection], None] | None = None,
        on_disconnected: Callable[[], None] | None = None,
        on_denied: Callable[[Denial], None] | None = None,
    ) -> None:
        """``on_denied``: a publish or subscription the broker refused (MQTT 5 only), on the network thread."""
        self.client_id = client_id
        self.address = address
        self.subscriptions = list(subscriptions or [])
        self.keepalive_s = keepalive_s
        self.persistent_session = persistent_session
        self.stop_flush_s = 5.0
        """How long ``stop`` lets queued messages drain before closing (large ones take a while)."""
        self.backoff = backoff or Backoff()
        self.connects = 0
        """Successful connects so far; ``reconnects`` is this minus the first."""
        self.taken_over = 0
        """Times the broker closed this connection because another one used its client id (MQTT 5 only)."""
        self.version: Literal["5", "3.1.1"] = "3.1.1" if address.mqtt_version == "3.1.1" else "5"
        """The MQTT version spoken now: 3.1.1 when configured, or once a broker refused 5 (auto)."""
        self.acks = AckTracker(on_denied, who=f"{client_id} on {address}")
        self._will = will
        self._max_inflight = max_inflight
        self._on_message = on_message
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._connected = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: deque[paho.MQTTMessageInfo] = deque()
        self._pending_lock = threading.Lock()
        self._client_lock = threading.Lock()
        """Held while publishing, while the network thread replaces the client (falling back to 3.1.1), and
        while it connects: paho gives the client its new socket before it queues CONNECT, and a PUBLISH queued
        in between would go first (the broker closes a connection that does not start with CONNECT). A
        publish waits out the connect (at most paho's connect timeout); one made while there is no socket is
        kept by paho and sent after the CONNACK."""
        self._unsettled: list[tuple[str, bytes, int, bool]] | None = [] if address.mqtt_version == "auto" else None
        """What was published before the first connect settled the version: sent again by a new client."""
        self._refused_v5 = False
        self._client = self._new_client()
        if self.version == "3.1.1":
            log.info("%s speaks MQTT 3.1.1 to %s (mqtt_version): %s", client_id, address, BLIND_311)

    def _new_client(self) -> paho.Client:
        v5 = self.version == "5"
        client = (LeanClient if lean_supported() else paho.Client)(  # fewer copies of what arrives
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=None if v5 else not self.persistent_session,  # 5: clean start, set on connect
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
        )
        client.max_inflight_messages_set(self._max_inflight)
        client.max_queued_messages_set(0)
        address = self.address
        if address.username:
            client.username_pw_set(address.username, address.password)
        if address.tls:
            # The broker's certificate is always verified, host name included (paho checks it
            # unless tls_insecure_set(True), which we never call); a client certificate, if any,
            # is what brokers with require_certificate authenticate this client by.
            client.tls_set(ca_certs=address.ca_file, certfile=address.cert_file, keyfile=address.key_file,
                           cert_reqs=ssl.CERT_REQUIRED)
        if self._will is not None:
            client.will_set(self._will.topic, self._will.payload, qos=1, retain=self._will.retain)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        client.on_publish = self._handle_publish
        client.on_subscribe = self._handle_subscribe
        # With a write hook registered, paho never writes from the publishing thread: it queues
        # the packet and wakes the network thread's select() through its socket pair, and our
        # loop() does every write. The hook itself has nothing to do.
        client.on_socket_register_write = _no_write_from_caller
        client.on_socket_unregister_write = _no_write_from_caller
        return client

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"mqtt-{self.client_id}", daemon=True)
        self._thread.start()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        """True once connected (False after ``timeout_s``)."""
        return self._connected.wait(timeout_s)

    @property
    def reconnects(self) -> int:
        return max(0, self.connects - 1)

    @property
    def denials(self) -> int:
        """Publishes and subscriptions the broker refused so far (always 0 over MQTT 3.1.1 publishes)."""
        return self.acks.denials

    def stop(self, timeout_s: float = 5.0) -> None:
        """Disconnect cleanly (the broker then does not send the last will), once what was published
        is acknowledged (within ``timeout_s``).

        Waiting matters: paho closes the socket right after writing DISCONNECT, and closing with
        acknowledgements still unread makes the kernel reset the connection; Mosquitto then
        drops the client as failed ("out of memory" in its log), sends the last will and may lose
        what it had not read yet - the coordinator's final "finished" status, say.
        """
        deadline = time.monotonic() + timeout_s
        if self._connected.is_set():
            with self._pending_lock:
                pending = list(self._pending)
            for info in pending:
                left = deadline - time.monotonic()
                if left <= 0 or not self._connected.is_set():
                    break
                try:
                    info.wait_for_publish(left)
                except (RuntimeError, ValueError):  # never queued, or the connection went meanwhile
                    break
        self._stopping.set()
        if self._connected.is_set():
            self._client.disconnect()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> paho.MQTTMessageInfo:
        """Queue a message from any thread; the network thread sends it now or after the next reconnect."""
        with self._client_lock:
            if self._unsettled is not None:
                self._unsettled.append((topic, payload, qos, retain))
            return self._publish_locked(topic, payload, qos, retain)

    def _publish_locked(self, topic: str, payload: bytes, qos: int, retain: bool) -> paho.MQTTMessageInfo:
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
        if qos > 0 and info.rc in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            self.acks.sent(info.mid, topic)  # NO_CONN: queued for the next connection, answered then
        if qos > 0 and info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:  # not queued for a later connection
            with self._pending_lock:  # what ``stop`` waits for; acknowledged ones are let go as we go
                self._pending.append(info)
                while self._pending and _acknowledged(self._pending[0]):
                    self._pending.popleft()
        return info

    # -- network thread ------------------------------------------------------------
    def _run(self) -> None:
        first = True
        while not self._stopping.is_set():
            failure = None
            with self._client_lock:  # no PUBLISH ahead of CONNECT (see _client_lock)
                try:
                    if first:
                        self._connect()
                        first = False
                    else:
                        self._client.reconnect()
                except (OSError, paho.WebsocketConnectionError) as exc:
                    failure = exc
            if failure is not None:  # publishers go on queueing meanwhile
                self._sleep_backoff(f"cannot connect to {self.address}: {failure}")
                continue
            rc = MQTTErrorCode.MQTT_ERR_SUCCESS
            while not self._stopping.is_set() and rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                try:
                    rc = self._client.loop(timeout=0.5)
                except Exception:  # a bug or bytes nothing expected: this thread must live on, so reconnect
                    log.exception("the MQTT network loop of %s failed; reconnecting", self.client_id)
                    rc = MQTTErrorCode.MQTT_ERR_UNKNOWN
                if self._unsettled is not None and self._connected.is_set():
                    with self._client_lock:  # the version is settled: nothing to send again any more
                        self._unsettled = None
            if self._stopping.is_set():
                # Let queued messages and the DISCONNECT out: paho closes the socket once the
                # DISCONNECT is written, and loop() then stops returning success.
                flush_until = time.monotonic() + self.stop_flush_s
                while time.monotonic() < flush_until:
                    if self._client.loop(timeout=0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                        break
                return
            self._connected.clear()
            if self._refused_v5:
                self._fall_back_to_311()
                first = True
                continue
            self._sleep_backoff(f"connection to {self.address} lost ({rc.name})")

    def _connect(self) -> None:
        if self.version == "3.1.1":
            self._client.connect(self.address.host, self.address.port, keepalive=self.keepalive_s)
            return
        properties = None
        if self.persistent_session:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = SESSION_NEVER_EXPIRES
        # Clean start on every connect for a clean session, never for a persistent one (a restarted
        # coordinator takes its session back, with what the broker queued for it meanwhile).
        self._client.connect(self.address.host, self.address.port, keepalive=self.keepalive_s,
                             clean_start=not self.persistent_session, properties=properties)

    def _fall_back_to_311(self) -> None:
        """The broker refused MQTT 5: a new 3.1.1 client, with what was published meanwhile."""
        log.warning("%s: the broker at %s refused MQTT 5 (unsupported protocol version): using MQTT 3.1.1, where %s",
                    self.client_id, self.address, BLIND_311)
        with self._client_lock:
            self._refused_v5 = False
            self.version = "3.1.1"
            self.acks.forget()
            with self._pending_lock:
                self._pending.clear()
            self._client = self._new_client()
            for topic, payload, qos, retain in self._unsettled or []:
                self._publish_locked(topic, payload, qos, retain)

    def _sleep_backoff(self, why: str) -> None:
        delay = self.backoff.next_delay()
        log.warning("%s: %s; retrying in %.1fs", self.client_id, why, delay)
        self._stopping.wait(delay)

    def _handle_connect(self, client: paho.Client, userdata: object, flags: paho.ConnectFlags,
                        reason_code: paho.ReasonCode, properties: object) -> None:
        if reason_code.is_failure:
            if (reason_code.value == UNSUPPORTED_PROTOCOL_VERSION and self.version == "5"
                    and self.address.mqtt_version == "auto" and self.connects == 0):
                self._refused_v5 = True  # the network thread makes a 3.1.1 client once this loop ends
                return
            log.error("broker %s refused the connection of %s: %s", self.address, self.client_id, reason_code)
            return
        self.backoff.reset()
        disable_nagle(client)
        for topic, qos in self.subscriptions:
            result, mid = client.subscribe(topic, qos)
            if result == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self.acks.subscribing(mid, topic)
        self.connects += 1
        self._connected.set()
        if self._on_connected is not None:
            self._on_connected(Connection(reconnect=self.connects > 1, session_present=bool(flags.session_present)))

    def _handle_disconnect(self, client: paho.Client, userdata: object, flags: paho.DisconnectFlags,
                           reason_code: paho.ReasonCode, properties: object) -> None:
        if flags.is_disconnect_packet_from_server and reason_code.is_failure:  # MQTT 5 says why
            log.warning("broker %s closed the connection of %s: %s (0x%02X)", self.address, self.client_id,
                        reason_code, reason_code.value)
            if reason_code.value == SESSION_TAKEN_OVER:
                self.taken_over += 1
                if self.taken_over == 1:
                    log.error("another client connected to %s with client id %s and took this one's session over: "
                              "is a second process running under the same id? (each takeover is counted)",
                              self.address, self.client_id)
        self._connected.clear()
        if self._on_disconnected is not None:
            self._on_disconnected()

    def _handle_publish(self, client: paho.Client, userdata: object, mid: int, reason_code: paho.ReasonCode,
                        properties: object) -> None:
        self.acks.published(mid, reason_code)

    def _handle_subscribe(self, client: paho.Client, userdata: object, mid: int,
                          reason_codes: list[paho.ReasonCode], properties: object) -> None:
        self.acks.subscribed(mid, reason_codes)

    def _handle_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        try:
            topic = message.topic
        except UnicodeDecodeError:  # MQTT topics are UTF-8: a broker that sends anything else is broken or hostile
            log.warning("dropped a message on a topic that is not UTF-8: %r", message._topic[:200])
            return
        self._on_message(topic, message.payload, bool(message.retain))
