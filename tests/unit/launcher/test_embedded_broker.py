"""The demo's embedded amqtt broker admits clients that connect all at once (launcher/amqtt_table.py).

Unpatched, amqtt 0.12.1 failed an admission or a delivery dozens of times in the first test's load ("dictionary
changed size during iteration", logged as "Unhandled exception in client_connected_cb"): the admitted client's session
task died and paho connected again. The test failed 3 of 3 runs that way, and passes with the table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import paho.mqtt.client as paho
import pytest

from launcher.amqtt_table import SnapshotList, SubscriptionTable, make_walks_safe
from launcher.broker import EmbeddedBroker

RETAINED = 50
WAVES, CLIENTS = 3, 30


def client(name: str) -> paho.Client:
    return paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=name, protocol=paho.MQTTv311)


def test_clients_connecting_at_once_are_all_admitted_and_served(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    broker = EmbeddedBroker().start()
    publisher = client("publisher")
    stop = threading.Event()
    live_thread: threading.Thread | None = None
    try:
        publisher.connect(broker.host, broker.port)
        publisher.loop_start()
        for i in range(RETAINED):
            publisher.publish(f"fl/t/retained/{i}", b"r" * 100, qos=1, retain=True).wait_for_publish(10)

        def live() -> None:  # deliveries in flight while clients subscribe and leave
            n = 0
            while not stop.is_set():
                publisher.publish(f"fl/t/live/{n % 7}", b"l" * 1000, qos=0)
                n += 1
                time.sleep(0.001)

        live_thread = threading.Thread(target=live, daemon=True)  # the only thread publishing from now on
        live_thread.start()
        retained: Counter[str] = Counter()
        lock = threading.Lock()
        for wave in range(WAVES):
            names = [f"c{wave}-{i}" for i in range(CLIENTS)]
            clients = []
            for name in names:
                c = client(name)
                c.on_connect = lambda cl, u, f, rc, p, n=name: cl.subscribe(
                    [(f"fl/t/inbox/{n}/#", 1), ("fl/t/live/#", 0), ("fl/t/retained/#", 1)])

                def on_message(cl: paho.Client, u: object, message: paho.MQTTMessage, n: str = name) -> None:
                    if message.topic.startswith("fl/t/retained/"):
                        with lock:
                            retained[n] += 1

                c.on_message = on_message
                clients.append(c)
            starters = [threading.Thread(target=lambda c=c: (c.connect(broker.host, broker.port), c.loop_start()))
                        for c in clients]
            for t in starters:
                t.start()
            for t in starters:
                t.join()
            deadline = time.monotonic() + 60
            while any(retained[n] < RETAINED for n in names) and time.monotonic() < deadline:
                time.sleep(0.05)
            short = {n: retained[n] for n in names if retained[n] < RETAINED}
            assert not short, f"wave {wave}: clients short of the {RETAINED} retained messages: {short}"
            for c in clients:
                c.disconnect()
                c.loop_stop()
    finally:
        stop.set()
        if live_thread is not None:
            live_thread.join(10)
        publisher.disconnect()
        publisher.loop_stop()
        broker.stop()
    errors = [r.getMessage() + (f": {r.exc_info[1]}" if r.exc_info else "") for r in caplog.records
              if r.levelno >= logging.ERROR]
    assert not errors, errors[:3]


def test_walks_see_a_snapshot_and_writes_land() -> None:
    table = SubscriptionTable({"a": [("s1", 0)]})
    assert type(table["a"]) is SnapshotList
    for key in table:
        table[key + "x"] = []  # grows while walked: no RuntimeError
    for _key, subscriptions in table.items():
        for entry in subscriptions:
            subscriptions.append(entry)  # a list grown while walked is walked as it was
    for _key in table.keys():
        table.pop("ax", None)
    assert dict(table) == {"a": [("s1", 0), ("s1", 0)]}
    assert list(table.values()) == [[("s1", 0), ("s1", 0)]]


def test_an_amqtt_without_the_table_is_refused_loudly() -> None:
    with pytest.raises(TypeError, match="_subscriptions"):
        make_walks_safe(object())
