"""A quick check that a broker does what the system needs: ``python -m launcher.brokercheck [amqtt|mosquitto]``.

Retained messages (and clearing them), QoS 1, multi-MB payloads live and retained, last
wills, and a burst of QoS 1 messages, all with paho-mqtt 2.x clients; and which MQTT version
it speaks (informative: amqtt speaks 3.1.1 only).
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import time
import uuid
from collections.abc import Callable

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import EmbeddedBroker, LocalBroker, MosquittoBroker

Received = tuple[str, bytes, bool, int]


def _client(broker: LocalBroker, inbox: queue.Queue[Received] | None = None, *, will: tuple[str, bytes] | None = None,
            subscribe: list[str] | None = None) -> paho.Client:
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"check-{uuid.uuid4().hex[:8]}",
                         protocol=paho.MQTTv311)
    client.max_inflight_messages_set(1000)
    if will is not None:
        client.will_set(will[0], will[1], qos=1, retain=True)
    subscribed = queue.Queue[int]()

    def on_connect(c: paho.Client, *_: object) -> None:
        for topic in subscribe or []:
            c.subscribe(topic, 1)
        if not subscribe:
            subscribed.put(0)

    client.on_connect = on_connect
    client.on_subscribe = lambda *_: subscribed.put(1)
    if inbox is not None:
        client.on_message = lambda c, u, m: inbox.put((m.topic, bytes(m.payload), bool(m.retain), m.qos))
    client.connect(broker.host, broker.port, keepalive=30)
    client.loop_start()
    for _ in range(max(1, len(subscribe or []))):
        subscribed.get(timeout=10)
    return client


def _close(client: paho.Client) -> None:
    client.disconnect()
    client.loop_stop()


def _expect(inbox: queue.Queue[Received], topic: str, timeout_s: float = 20.0) -> Received:
    deadline = time.monotonic() + timeout_s
    while True:
        item = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        if item[0] == topic:
            return item


def check_retained(broker: LocalBroker) -> str:
    pub = _client(broker)
    pub.publish("check/retained", b"hello", qos=1, retain=True).wait_for_publish(10)
    inbox: queue.Queue[Received] = queue.Queue()
    sub = _client(broker, inbox, subscribe=["check/retained"])
    topic, payload, retained, _ = _expect(inbox, "check/retained")
    assert payload == b"hello" and retained, (payload[:20], retained)
    pub.publish("check/retained", b"", qos=1, retain=True).wait_for_publish(10)
    _expect(inbox, "check/retained")  # the live clear itself
    _close(sub)
    late: queue.Queue[Received] = queue.Queue()
    sub2 = _client(broker, late, subscribe=["check/retained"])
    time.sleep(0.5)
    left = [item for item in list(late.queue) if item[0] == "check/retained"]
    assert not left, "a cleared retained message was still delivered"
    _close(sub2)
    _close(pub)
    return "retained message delivered to a late subscriber, and cleared by an empty payload"


def check_large(broker: LocalBroker, megabytes: int = 8) -> str:
    payload = os.urandom(megabytes * 1024 * 1024)
    inbox: queue.Queue[Received] = queue.Queue()
    sub = _client(broker, inbox, subscribe=["check/large/#"])
    pub = _client(broker)
    started = time.perf_counter()
    pub.publish("check/large/live", payload, qos=1, retain=True).wait_for_publish(30)
    _, got, _, qos = _expect(inbox, "check/large/live", 60)
    live_s = time.perf_counter() - started
    assert got == payload and qos == 1
    late: queue.Queue[Received] = queue.Queue()
    sub2 = _client(broker, late, subscribe=["check/large/#"])
    _, got2, retained, _ = _expect(late, "check/large/live", 60)
    assert got2 == payload and retained
    pub.publish("check/large/live", b"", qos=1, retain=True).wait_for_publish(10)
    for client in (sub, sub2, pub):
        _close(client)
    return f"{megabytes} MB QoS 1 payload delivered live in {live_s:.2f}s and retained to a late subscriber"


def check_will(broker: LocalBroker) -> str:
    inbox: queue.Queue[Received] = queue.Queue()
    watcher = _client(broker, inbox, subscribe=["check/will"])
    doomed = _client(broker, will=("check/will", b"offline"))
    time.sleep(0.3)
    sock = doomed.socket()
    assert isinstance(sock, socket.socket)
    sock.shutdown(socket.SHUT_RDWR)  # drop the TCP connection without DISCONNECT, like a crash
    _, payload, _, _ = _expect(inbox, "check/will", 20)
    assert payload == b"offline"
    doomed.loop_stop()
    _close(watcher)
    return "last will published when a client vanished without DISCONNECT"


def check_burst(broker: LocalBroker, count: int = 2000) -> str:
    inbox: queue.Queue[Received] = queue.Queue()
    sub = _client(broker, inbox, subscribe=["check/burst"])
    pub = _client(broker)
    started = time.perf_counter()
    infos = [pub.publish("check/burst", i.to_bytes(4, "big"), qos=1) for i in range(count)]
    for info in infos:
        info.wait_for_publish(30)
    got = [_expect(inbox, "check/burst", 30) for _ in range(count)]
    elapsed = time.perf_counter() - started
    assert sorted(int.from_bytes(p, "big") for _, p, _, _ in got) == list(range(count))
    _close(sub)
    _close(pub)
    return f"{count} QoS 1 messages in {elapsed:.2f}s ({count / elapsed:.0f}/s)"


def check_mqtt5(broker: LocalBroker) -> str:
    """Informative, never failing: whether the broker speaks MQTT 5 (whose reason codes show refused
    publishes) or only 3.1.1, for which clients need mqtt_version 3.1.1 (or auto, if it says so)."""
    answers: queue.Queue[paho.ReasonCode] = queue.Queue()
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"check-{uuid.uuid4().hex[:8]}",
                         protocol=paho.MQTTv5)
    client.on_connect = lambda c, u, f, rc, p: answers.put(rc)
    client.connect(broker.host, broker.port, keepalive=30)
    client.loop_start()
    try:
        code = answers.get(timeout=10)
    except queue.Empty:
        return "MQTT 5 CONNECT not answered: clients need mqtt_version 3.1.1"
    finally:
        _close(client)
    if code.is_failure:
        return f"MQTT 5 refused ({code}): 3.1.1 only, where refused publishes cannot be seen (mqtt_version auto falls back)"
    return "MQTT 5 spoken: refused publishes and subscriptions are seen by the clients"


CHECKS: list[Callable[[LocalBroker], str]] = [check_retained, check_large, check_will, check_burst, check_mqtt5]


def run_checks(broker: LocalBroker) -> bool:
    ok = True
    for check in CHECKS:
        try:
            print(f"  ok    {check.__name__}: {check(broker)}")
        except Exception as exc:  # noqa: BLE001 - report every failing check
            ok = False
            print(f"  FAIL  {check.__name__}: {type(exc).__name__}: {exc}")
    return ok


def main(argv: list[str]) -> int:
    kinds = argv or ["amqtt", "mosquitto"]
    ok = True
    for kind in kinds:
        broker: LocalBroker = EmbeddedBroker() if kind == "amqtt" else MosquittoBroker()
        with broker:
            print(f"{kind} on {broker.url}")
            ok = run_checks(broker) and ok
        if isinstance(broker, MosquittoBroker):
            broker.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
