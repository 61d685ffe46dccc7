"""The MQTT session both sides use: paho-mqtt 2.x with our reconnect policy.

* subscriptions are (re)made in ``on_connect``, so they survive reconnects;
* reconnects back off exponentially with full jitter, so a fleet that lost its broker
  does not reconnect in lock-step;
* the in-flight window is raised (paho's default of 20 throttles QoS 1 to tens of
  messages a second on loopback);
* callbacks run on the network thread and must only hand work over (e.g. to a queue);
* one writer per socket: ``publish`` may be called from any thread, but only the network
  thread writes to the socket. paho writes straight from the caller's thread when it runs
  no loop thread of its own, and two writers interleave the bytes of large messages.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from pydantic import ValidationInfo

log = logging.getLogger(__name__)

MessageHandler = Callable[[str, bytes, bool], None]
"""(topic, payload, retained) -> None, called on the network thread."""


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    """PEM file of the CA(s) that signed the broker's certificate; None trusts the system's CAs."""
    cert_file: str | None = None
    """PEM file of this client's certificate (and chain), for brokers that require one; needs key_file."""
    key_file: str | None = None
    """PEM file of the private key of cert_file."""

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """``mqtt://[user[:password]@]host[:port]`` or ``mqtts://`` for TLS."""
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"broker URL {url!r} must start with mqtt:// (or tcp://), or mqtts:// (or ssl://) for TLS")
        if not parts.hostname:
            raise ValueError(f"broker URL {url!r} has no host")
        tls = parts.scheme in ("mqtts", "ssl")
        try:
            port = parts.port or (8883 if tls else 1883)
        except ValueError as exc:
            raise ValueError(f"broker URL {url!r}: {exc}") from None
        return cls(
            host=parts.hostname,
            port=port,
            tls=tls,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
        )

    def with_credentials(self, username: str | None, password: str | None) -> BrokerAddress:
        """This address, with credentials given apart (settings, a Secret) winning over the URL's."""
        return replace(self, username=username or self.username, password=password or self.password)

    def with_tls_files(self, ca_file: str | os.PathLike[str] | None = None,
                       cert_file: str | os.PathLike[str] | None = None,
                       key_file: str | os.PathLike[str] | None = None) -> BrokerAddress:
        """This address with a private CA and/or a client certificate; checked by ``check_tls_files``."""
        check_tls_files(self.tls, ca_file=ca_file, cert_file=cert_file, key_file=key_file)
        return replace(self, ca_file=_path_or_none(ca_file), cert_file=_path_or_none(cert_file),
                       key_file=_path_or_none(key_file))

    def __str__(self) -> str:  # never print the password
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"


def _path_or_none(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.fspath(path)


def check_tls_file(name: str, path: str | os.PathLike[str] | None, tls: bool) -> None:
    """One of ca_file, cert_file, key_file: only with TLS, and a readable file; ValueError names it."""
    if path is None:
        return
    if not tls:
        raise ValueError(f"{name} is only used over TLS: the broker URL must start with mqtts:// (or ssl://)")
    if not os.path.exists(path):
        raise ValueError(f"{name} {os.fspath(path)!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"{name} {os.fspath(path)!r} is not a file")
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise ValueError(f"{name} {os.fspath(path)!r} cannot be read: {exc.strerror}") from None


def tls_file_setting(cls: type, value: Path | None, info: ValidationInfo) -> Path | None:
    """Field validator for both services' ca_file, cert_file and key_file: a readable file, and only
    with an mqtts:// URL (``broker_url`` is declared before them, so it is validated first)."""
    url = info.data.get("broker_url")
    check_tls_file(str(info.field_name), value, BrokerAddress.parse(url).tls if url else True)
    return value


def check_tls_files(tls: bool, *, ca_file: str | os.PathLike[str] | None = None,
                    cert_file: str | os.PathLike[str] | None = None,
                    key_file: str | os.PathLike[str] | None = None) -> None:
    """The TLS files of a broker connection: each readable, only over TLS, a certificate with its key."""
    for name, path in (("ca_file", ca_file), ("cert_file", cert_file), ("key_file", key_file)):
        check_tls_file(name, path, tls)
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together: a client certificate needs its private key")


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
    ) -> None:
        self.client_id = client_id
        self.address = address
        self.subscriptions = list(subscriptions or [])
        self.keepalive_s = keepalive_s
        self.stop_flush_s = 5.0
        """How long ``stop`` lets queued messages drain before closing (large ones take a while)."""
        self.backoff = backoff or Backoff()
        self.connects = 0
        """Successful connects so far; ``reconnects`` is this minus the first."""
        self._on_message = on_message
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._connected = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: deque[paho.MQTTMessageInfo] = deque()
        self._pending_lock = threading.Lock()

        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=not persistent_session,
            protocol=paho.MQTTv311,
        )
        client.max_inflight_messages_set(max_inflight)
        client.max_queued_messages_set(0)
        if address.username:
            client.username_pw_set(address.username, address.password)
        if address.tls:
            # The broker's certificate is always verified, host name included (paho checks it
            # unless tls_insecure_set(True), which we never call); a client certificate, if any,
            # is what brokers with require_certificate authenticate this client by.
            client.tls_set(ca_certs=address.ca_file, certfile=address.cert_file, keyfile=address.key_file,
                           cert_reqs=ssl.CERT_REQUIRED)
        if will is not None:
            client.will_set(will.topic, will.payload, qos=1, retain=will.retain)
        client.on_connect = self._handle_connect
        client.on_disconnect = self._handle_disconnect
        client.on_message = self._handle_message
        # With a write hook registered, paho never writes from the publishing thread: it queues
        # the packet and wakes the network thread's select() through its socket pair, and our
        # loop() does every write. The hook itself has nothing to do.
        client.on_socket_register_write = _no_write_from_caller
        client.on_socket_unregister_write = _no_write_from_caller
        self._client = client

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
        info = self._client.publish(topic, payload, qos=qos, retain=retain)
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
            try:
                if first:
                    self._client.connect(self.address.host, self.address.port, keepalive=self.keepalive_s)
                    first = False
                else:
                    self._client.reconnect()
            except (OSError, paho.WebsocketConnectionError) as exc:
                self._sleep_backoff(f"cannot connect to {self.address}: {exc}")
                continue
            rc = MQTTErrorCode.MQTT_ERR_SUCCESS
            while not self._stopping.is_set() and rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                rc = self._client.loop(timeout=0.5)
            if self._stopping.is_set():
                # Let queued messages and the DISCONNECT out: paho closes the socket once the
                # DISCONNECT is written, and loop() then stops returning success.
                flush_until = time.monotonic() + self.stop_flush_s
                while time.monotonic() < flush_until:
                    if self._client.loop(timeout=0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                        break
                return
            self._connected.clear()
            self._sleep_backoff(f"connection to {self.address} lost ({rc.name})")

    def _sleep_backoff(self, why: str) -> None:
        delay = self.backoff.next_delay()
        log.warning("%s; retrying in %.1fs", why, delay)
        self._stopping.wait(delay)

    def _handle_connect(self, client: paho.Client, userdata: object, flags: paho.ConnectFlags,
                        reason_code: paho.ReasonCode, properties: object) -> None:
        if reason_code.is_failure:
            log.error("broker %s refused the connection: %s", self.address, reason_code)
            return
        self.backoff.reset()
        for topic, qos in self.subscriptions:
            client.subscribe(topic, qos)
        self.connects += 1
        self._connected.set()
        if self._on_connected is not None:
            self._on_connected(Connection(reconnect=self.connects > 1, session_present=bool(flags.session_present)))

    def _handle_disconnect(self, client: paho.Client, userdata: object, flags: paho.DisconnectFlags,
                           reason_code: paho.ReasonCode, properties: object) -> None:
        self._connected.clear()
        if self._on_disconnected is not None:
            self._on_disconnected()

    def _handle_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        self._on_message(message.topic, message.payload, bool(message.retain))
