"""A flood from agents nobody enrolled, signed with keys nobody enrolled (for bench/flood.py and the flood test).

    python bench/flooder.py --url mqtt://127.0.0.1:1883 --federation demo --count 3000 --keys 50 --rate 1000

Each message goes to a made-up agent's topic, a new random id every time
(``fl/<federation>/agents/sybil-<hex>/status``, or ``fl/<federation>/updates/sybil-<hex>/<round>``
for the ``--updates`` fraction), signed by one of ``--keys`` random keys, at QoS 1 and ``--rate``
messages per second (0: as fast as the broker takes them). ``--raw`` writes MQTT 3.1.1 PUBLISH
packets at QoS 0 straight to a socket instead, several times faster than a paho client: a flood
beyond what the coordinator's network thread takes (the broker delivers them at QoS 0, queued
for the coordinator like the rest, nothing acknowledged). With ``--stdin`` it connects, then waits
for a line on its standard input before it starts, and after ``--count`` messages goes on until
its standard input is closed (a test starts and stops it on conditions it sees). Once the broker
has acknowledged every one it prints a JSON line, ``{"statuses": n, "updates": m, "seconds": s}``,
and exits 0. It runs as its own process, like an attacker's: it does not share the coordinator's
Python lock.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import socket
import struct
import sys
import threading
import time

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from protocol.messages import AgentStatus, TrainMetrics, Update
from protocol.security.signing import SigningKey
from protocol.tasks import BUILTIN_CARDS
from protocol.topics import Topics
from protocol.transport.mqtt import BrokerAddress
from protocol.wire import encode_message

TASK = BUILTIN_CARDS["digits"].ref
BATCH_S = 0.01


def payloads(keys: int, seed: int) -> tuple[list[bytes], list[bytes]]:
    """One signed status and one signed update per key (what is inside does not matter: no key is enrolled)."""
    statuses, updates = [], []
    for k in range(keys):
        key = SigningKey.generate()
        agent_id = f"sybil-{seed}-{k}"
        status = AgentStatus(agent_id=agent_id, state="online", device="phone", family="mlp_tiny",
                             num_samples=10**6, num_eval_samples=1, version="0", timestamp=time.time(),
                             task_ref=TASK, layout="0" * 32)
        update = Update(run_id="flood", agent_id=agent_id, round=1, task="train", task_ref=TASK, family="mlp_tiny",
                        base_digest=None, num_samples=10**6, weights={"w": np.ones(16, dtype=np.float32)},
                        metrics=TrainMetrics())
        statuses.append(encode_message(key.seal(encode_message(status))))
        updates.append(encode_message(key.seal(encode_message(update))))
    return statuses, updates


def flood(url: str, federation: str, count: int, keys: int, rate: float, update_share: float, seed: int,
          controlled: bool = False, timeout_s: float = 300.0) -> dict[str, float]:
    """``controlled``: start on a line of stdin; after ``count`` messages, go on until stdin is closed."""
    rng = random.Random(seed)
    statuses, updates = payloads(keys, seed)
    topics = Topics(federation)
    address = BrokerAddress.parse(url)
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=f"flooder-{secrets.token_hex(4)}",
                         protocol=paho.MQTTv311)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    acked = 0
    lock = threading.Lock()

    def on_publish(c: paho.Client, userdata: object, mid: int, reason: object, properties: object) -> None:
        nonlocal acked
        with lock:
            acked += 1

    connected = threading.Event()
    client.on_connect = lambda c, u, f, rc, p: connected.set()
    client.on_publish = on_publish
    client.connect(address.host, address.port)
    client.loop_start()
    if not connected.wait(30):
        raise SystemExit(f"could not connect to {url}")
    stopped = threading.Event()
    if controlled:
        sys.stdin.readline()
        threading.Thread(target=lambda: (sys.stdin.read(), stopped.set()), daemon=True).start()
    else:
        stopped.set()
    sent = {"statuses": 0, "updates": 0}
    started = time.monotonic()
    n = 0
    while n < count or not stopped.is_set():
        if rate > 0:
            due = started + n / rate
            if due - time.monotonic() > BATCH_S:  # pace in small batches: one sleep per BATCH_S of messages
                time.sleep(due - time.monotonic())
        agent_id = f"sybil-{secrets.token_hex(4)}"
        if rng.random() < update_share:
            client.publish(topics.update(agent_id, 1 + rng.randrange(8)), rng.choice(updates), qos=1)
            sent["updates"] += 1
        else:
            client.publish(topics.agent_status(agent_id), rng.choice(statuses), qos=1)
            sent["statuses"] += 1
        n += 1
    deadline = time.monotonic() + timeout_s
    while acked < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the broker acknowledged {acked} of {n} messages within {timeout_s:.0f}s")
        time.sleep(0.01)
    seconds = time.monotonic() - started
    client.disconnect()
    client.loop_stop()
    return {**sent, "seconds": round(seconds, 3)}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + _varint(len(body)) + body


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!H", len(data)) + data


def raw_flood(url: str, federation: str, count: int, keys: int, rate: float, update_share: float,
              seed: int) -> dict[str, float]:
    """The same flood, as QoS 0 PUBLISH packets written to the socket in batches (no per-message client work)."""
    rng = random.Random(seed)
    statuses, updates = payloads(keys, seed)
    root = Topics(federation).root
    address = BrokerAddress.parse(url)
    with socket.create_connection((address.host, address.port), timeout=30) as sock:
        connect = _string("MQTT") + bytes([4, 0x02]) + struct.pack("!H", 60) + _string(f"flooder-{secrets.token_hex(4)}")
        sock.sendall(_packet(0x10, connect))
        if sock.recv(4)[:1] != b"\x20":
            raise SystemExit(f"no CONNACK from {url}")
        sent = {"statuses": 0, "updates": 0}
        started = time.monotonic()
        n = 0
        while n < count:
            if rate > 0:
                due = started + n / rate
                if due - time.monotonic() > BATCH_S:
                    time.sleep(due - time.monotonic())
            batch = []
            for _ in range(min(100, count - n)):
                agent_id = f"sybil-{secrets.token_hex(4)}"
                if rng.random() < update_share:
                    topic, payload = f"{root}/updates/{agent_id}/{1 + rng.randrange(8)}", rng.choice(updates)
                    sent["updates"] += 1
                else:
                    topic, payload = f"{root}/agents/{agent_id}/status", rng.choice(statuses)
                    sent["statuses"] += 1
                batch.append(_packet(0x30, _string(topic) + payload))
                n += 1
            sock.sendall(b"".join(batch))
        sock.sendall(_packet(0xE0, b""))  # DISCONNECT, after everything written
        seconds = time.monotonic() - started
    return {**sent, "seconds": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--federation", required=True)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--rate", type=float, default=0.0, help="messages per second; 0: as fast as possible")
    parser.add_argument("--updates", type=float, default=0.1, help="share of the messages that are updates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raw", action="store_true", help="QoS 0 packets straight to a socket: a faster flood")
    parser.add_argument("--stdin", action="store_true",
                        help="start on a line of stdin; after --count messages, go on until stdin is closed")
    args = parser.parse_args()
    if args.raw:
        if args.stdin:
            parser.error("--raw does not take --stdin")
        print(json.dumps(raw_flood(args.url, args.federation, args.count, args.keys, args.rate, args.updates,
                                   args.seed)), flush=True)
        return
    print(json.dumps(flood(args.url, args.federation, args.count, args.keys, args.rate, args.updates, args.seed,
                           args.stdin)), flush=True)


if __name__ == "__main__":
    main()
