"""The raw transport baseline of bench/scale.py: a round's updates, built again as the round built them
(``LightFleet.replay_messages``), sent on the fleet's publishers to a bare subscriber in a process of its own.

What it costs is the fleet's sending, the broker and the MQTT client (the coordinator's own, so the baseline pays
what the coordinator's link pays), with nothing decoded, validated or aggregated.
``python bench/raw_transport.py sink URL TOPIC COUNT`` is that subscriber.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

import paho.mqtt.client as paho
from lightfleet import Publisher
from paho.mqtt.enums import CallbackAPIVersion

from protocol.transport.lean_publish import LeanClient, lean_supported
from protocol.transport.mqtt import BrokerAddress
from protocol.transport.sockets import disable_nagle


def replay_raw(publishers: list[Publisher], messages: list[Callable[[], Iterator[bytes]]], topic: str) -> float:
    """Publish what ``messages[k]()`` yields on publisher k (``LightFleet.replay_messages``: a round's updates,
    built as the round built them), all publishers at once; returns the wall clock (time.time) of the first
    publish."""
    done = threading.Event()
    left = [len(publishers)]
    lock = threading.Lock()
    start = time.time()

    def job(publisher: Publisher, mine: Callable[[], Iterator[bytes]]) -> None:
        for n, payload in enumerate(mine()):
            publisher.publish(f"{topic}/{publisher.name}/{n}", payload)
        with lock:
            left[0] -= 1
            if not left[0]:
                done.set()

    for publisher, mine in zip(publishers, messages, strict=True):
        publisher.jobs.put(lambda p, mine=mine: job(p, mine))
    done.wait()
    return start


def sink_main(url: str, topic: str, count: int) -> int:
    """Receive ``count`` messages on ``topic``/#; print the time.time() of the first and last, and the bytes."""
    address = BrokerAddress.parse(url)
    got = {"n": 0, "bytes": 0, "first": 0.0, "last": 0.0}
    finished = threading.Event()
    # The coordinator's receiving code (MqttLink's client), so the baseline pays what the coordinator's link does.
    client = (LeanClient if lean_supported() else paho.Client)(
        callback_api_version=CallbackAPIVersion.VERSION2, client_id="raw-sink", clean_session=True,
        protocol=paho.MQTTv311)

    def on_connect(c: paho.Client, u: object, f: object, r: object, p: object) -> None:
        disable_nagle(c)
        c.subscribe(f"{topic}/#", qos=1)

    def on_subscribe(c: paho.Client, u: object, mid: int, r: object, p: object) -> None:
        print("ready", flush=True)

    def on_message(c: paho.Client, u: object, message: paho.MQTTMessage) -> None:
        now = time.time()
        got["first"] = got["first"] or now
        got["last"] = now
        got["n"] += 1
        got["bytes"] += len(message.payload)
        if got["n"] >= count:
            finished.set()

    client.on_connect, client.on_subscribe, client.on_message = on_connect, on_subscribe, on_message
    client.connect(address.host, address.port, keepalive=60)
    client.loop_start()
    finished.wait()
    print(f"done {got['first']:.6f} {got['last']:.6f} {got['n']} {got['bytes']}", flush=True)
    client.disconnect()
    client.loop_stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "sink":
        sys.exit(sink_main(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    print(f"usage: {sys.argv[0]} sink URL TOPIC COUNT", file=sys.stderr)
    sys.exit(2)
