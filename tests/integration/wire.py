"""Test helpers that look at the system from outside: the wire, the metrics, the files, the processes."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families

from coordinator.fleet.enrollment import read_enrollment
from launcher.fleet import Fleet
from protocol.limits import DEFAULT_LIMITS
from protocol.messages import Message, Signed
from protocol.security.signing import KeyLookup, PublicKey, SigningKey, unseal
from protocol.security.trust import OPEN, decode_trusted
from protocol.transport.mqtt import BrokerAddress
from protocol.wire import decode_message

M = TypeVar("M", bound=Message)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""Prometheus samples: (name, labels) -> value."""


@dataclass(frozen=True)
class Seen:
    topic: str
    payload: bytes
    retained: bool
    at: float


class WireRecorder:
    """An independent MQTT subscriber that records every message on ``topic_filter``."""

    def __init__(self, url: str, topic_filter: str, client_id: str = "wire-recorder",
                 tls_files: tuple[Path, Path, Path] | None = None) -> None:
        """``tls_files``: (CA, client certificate, key) for a broker that wants client certificates."""
        address = BrokerAddress.parse(url)
        self.address = address
        self.topic_filter = topic_filter
        self.messages: list[Seen] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id,
                                   protocol=paho.MQTTv311)
        self._client.max_inflight_messages_set(1000)
        if address.username:
            self._client.username_pw_set(address.username, address.password)
        if tls_files is not None:
            ca_file, cert_file, key_file = tls_files
            self._client.tls_set(ca_certs=str(ca_file), certfile=str(cert_file), keyfile=str(key_file))
        self._client.reconnect_delay_set(0.1, 1)  # chaos tests restart the broker: come back fast
        self._client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic_filter, qos=1)
        self._client.on_subscribe = lambda c, u, mid, rcs, p: self._subscribed.set()
        self._client.on_message = self._on_message

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        with self._lock:
            self.messages.append(Seen(message.topic, bytes(message.payload), bool(message.retain), time.monotonic()))

    def start(self, timeout_s: float = 10.0) -> WireRecorder:
        self._client.connect(self.address.host, self.address.port)
        self._client.loop_start()
        if not self._subscribed.wait(timeout_s):
            raise TimeoutError(f"could not subscribe to {self.topic_filter} on {self.address}")
        return self

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def __enter__(self) -> WireRecorder:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def snapshot(self, predicate: Callable[[Seen], bool] = lambda s: True) -> list[Seen]:
        with self._lock:
            return [m for m in self.messages if predicate(m)]


def retained_messages(url: str, topic_filter: str, settle_s: float = 1.0) -> dict[str, bytes]:
    """What a client connecting now receives as retained on ``topic_filter``."""
    recorder = WireRecorder(url, topic_filter, client_id="retained-reader")
    recorder.start()
    time.sleep(settle_s)
    recorder.stop()
    return {m.topic: m.payload for m in recorder.snapshot(lambda s: s.retained)}


def scrape(port: int | None, host: str = "127.0.0.1") -> Samples:
    """Prometheus samples of an HTTP /metrics endpoint: (name, labels) -> value."""
    assert port, "no /metrics port: give the coordinator an http_port"
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def metric(samples: Samples, name: str, **labels: str) -> float:
    """The sample with exactly these labels; 0 if there is none."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def metric_total(samples: Samples, name: str) -> float:
    """The sum over every label set of ``name`` (e.g. over all device classes)."""
    return sum(value for (sample, _), value in samples.items() if sample == name)


def read_rounds(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def wait_for_rounds(fleet: Fleet, count: int, timeout_s: float, path: Path | None = None) -> list[dict]:
    """Wait until the round log (``fleet.rounds_path`` unless ``path``) holds ``count`` rounds.

    Fails at once, with the coordinator's log tail, if the coordinator exits before that (a crash,
    or a run that ended short), and with the same tail after ``timeout_s``.
    """
    path = path or fleet.rounds_path
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = not fleet.coordinator.running  # before reading: it writes its last round, then exits
        rounds = read_rounds(path)
        if len(rounds) >= count:
            return rounds
        if exited:
            raise AssertionError(f"the coordinator exited with {fleet.coordinator.returncode} after "
                                 f"{len(rounds)} of {count} rounds:\n{fleet.coordinator.log_tail(40)}")
        time.sleep(0.2)
    raise AssertionError(f"only {len(read_rounds(path))} of {count} rounds closed within "
                         f"{timeout_s:.0f}s; coordinator log:\n{fleet.coordinator.log_tail(40)}")


def assert_all_completed(rounds: list[dict[str, Any]], count: int) -> None:
    """``count`` rounds in the log, every one completed."""
    assert [r["outcome"] for r in rounds] == ["completed"] * count, [
        {k: r.get(k) for k in ("round", "task", "outcome", "reason", "selected", "answered", "stragglers",
                                "dropouts")} for r in rounds]


def assert_agents_exit_cleanly(fleet: Fleet, timeout_s: float) -> None:
    """Every agent exits with 0, each within ``timeout_s`` (they exit once the run is finished)."""
    for name, process in fleet.agents.items():
        assert process.wait(timeout_s) == 0, f"{name} did not exit cleanly:\n{process.log_tail()}"


def decode_wire(payload: bytes, expect: type[M]) -> M:
    """A message as seen on the wire, out of its signed envelope if it has one (not verified here:
    see ``signer_of``)."""
    return decode_trusted(payload, expect, DEFAULT_LIMITS, OPEN).message


def fleet_keys(fleet: Fleet) -> KeyLookup:
    """The keys a fleet's messages must be signed with: the coordinator's and every enrolled agent's."""
    keys: dict[str, tuple[str, PublicKey]] = {}
    coordinator = SigningKey.load(fleet.coordinator_dir / "coordinator_key.pem").public_key
    keys[coordinator.key_id] = ("coordinator", coordinator)
    for agent in read_enrollment(fleet.coordinator_dir / "enrolled.json").values():
        keys[agent.key.key_id] = (agent.agent_id, agent.key)
    return keys.get


def signer_of(payload: bytes, keys: KeyLookup) -> str:
    """Who signed a message seen on the wire; fails unless it is signed and the signature verifies."""
    envelope = decode_message(payload, Signed)
    signer, _ = unseal(envelope, keys)
    return signer


def http_status(url: str) -> int:
    """The HTTP status ``url`` answers with; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0
