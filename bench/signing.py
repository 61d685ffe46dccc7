"""What signing and opening cost, against what a round at scale spends per update anyway.

    python bench/signing.py            # 127k and 1M float32 parameters (0.5 and 4 MB updates)
    python bench/signing.py --quick    # fewer repetitions and messages: seconds, for CI

Every agent seals its update (sign) and the coordinator opens it (verify, then decode and
validate) before admission; the coordinator signs each family's global state once per round
and every agent verifies it. Baselines measured in the same run: the plain codec work on the
same message (encode + validated decode), and the **pipelined** transport through a real
Mosquitto on this machine: many such messages published back to back (QoS 1) to one
subscriber, first publish to last receipt, divided by their number. That is what a round at
scale spends per update (10,000 x 127k: 7.3 s / 10,000 = 0.73 ms), not one message's latency
(several ms, which a round overlaps). The coordinator opens updates on a pool of two workers
(coordinator/app/openers.py), so the per-update opening cost that a round cannot hide is the
pool's throughput: the same messages opened with ``WORKERS`` threads, wall time / messages.
Goal: opening per update on the pool <= ``GOAL`` x pipelined transport per message, which
leaves the loop room to fold and still finish within 1.3x the raw transport
(bench/scale.py). Exits 0 whatever the timings (MISS is printed); 1 only if a sealed update
does not open to what was sealed.
"""

from __future__ import annotations

import argparse
import platform
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from codec import make_update, model_arrays
from timing import median_seconds

from coordinator.aggregation.running_mean import with_norm
from launcher.broker import MosquittoBroker
from protocol.limits import DEFAULT_LIMITS
from protocol.messages import Signed, Update
from protocol.security.signing import SigningKey, single_key
from protocol.security.trust import Trust, decode_trusted
from protocol.transport.mqtt import BrokerAddress, MqttLink
from protocol.wire import decode_message, encode_message

GOAL = 0.3  # opening an update on the pool / pipelined transport per message
WORKERS = 2  # as coordinator/app/openers.py


def measure(num_params: int, repeats: int) -> dict[str, float]:
    key = SigningKey.generate()
    trust = Trust(single_key("agent-0", key.public_key), required=True)
    update = make_update(model_arrays(num_params))
    plain = encode_message(update)
    sealed = encode_message(key.seal(plain))
    opened = decode_trusted(sealed, Update, DEFAULT_LIMITS, trust).message
    if encode_message(opened) != plain:
        raise SystemExit("a sealed update did not open to what was sealed")
    envelope = decode_message(sealed, Signed)
    times = median_seconds({
        "encode": lambda: encode_message(update),
        "decode": lambda: decode_message(plain, Update),
        "sign": lambda: encode_message(key.seal(plain)),
        "verify": lambda: key.public_key.verify(envelope.payload, envelope.signature),
        "open": lambda: decode_trusted(sealed, Update, DEFAULT_LIMITS, trust),
    }, repeats)
    return {"bytes": float(len(plain)), **times}


def pooled_open_seconds(num_params: int, messages: int) -> float:
    """Wall time per update to open ``messages`` sealed updates on ``WORKERS`` threads, as the coordinator does
    (coordinator/admission/intake.py ``Intake.open``: verify, decode and validate, and the delta's norm)."""
    key = SigningKey.generate()
    trust = Trust(single_key("agent-0", key.public_key), required=True)
    plain = encode_message(make_update(model_arrays(num_params)))
    sealed = [encode_message(key.seal(plain)) for _ in range(min(messages, 8))]  # distinct objects, as received

    def open_one(i: int) -> float:  # what Intake.open does: verify, decode and validate, then the delta's norm
        return with_norm(decode_trusted(sealed[i % len(sealed)], Update, DEFAULT_LIMITS, trust).message.delta).norm

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(open_one, range(len(sealed))))  # warm-up
        started = time.perf_counter()
        for _ in pool.map(open_one, range(messages)):
            pass
        return (time.perf_counter() - started) / messages


def transport_seconds(payload: bytes, messages: int) -> tuple[float, float]:
    """Through Mosquitto, QoS 1, one subscriber: (one message's median latency, publish to receipt, over a few
    repetitions; wall time per message when ``messages`` of them are published back to back)."""
    arrived = threading.Event()
    count = [0]
    lock = threading.Lock()

    def heard(*_: object) -> None:
        with lock:
            count[0] += 1
        arrived.set()

    with MosquittoBroker() as broker:
        address = BrokerAddress.parse(broker.url)
        receiver = MqttLink("receiver", address, heard, subscriptions=[("bench/#", 1)])
        sender = MqttLink("sender", address, lambda *_: None)
        receiver.start(), sender.start()
        try:
            if not (receiver.wait_connected(30) and sender.wait_connected(30)):
                raise SystemExit("could not connect to the bench broker")
            for _ in range(100):  # the receiver subscribes once connected: wait until it hears one
                sender.publish("bench/probe", b"x")
                if arrived.wait(0.2):
                    break

            def once() -> None:
                arrived.clear()
                sender.publish("bench/payload", payload)
                if not arrived.wait(60):
                    raise SystemExit("a bench message never arrived")

            latency = median_seconds({"transport": once}, 5)["transport"]
            with lock:
                count[0] = 0
            started = time.perf_counter()
            for _ in range(messages):
                sender.publish("bench/stream", payload)
            deadline = time.monotonic() + 60 + messages * len(payload) / 5e6
            while count[0] < messages:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {count[0]} of {messages} streamed messages arrived")
                time.sleep(0.001)
            return latency, (time.perf_counter() - started) / messages
        finally:
            sender.stop(), receiver.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 5 if args.quick else 21
    stream_bytes = 50e6 if args.quick else 400e6  # per size: enough messages that the pipeline fills
    print(f"python {platform.python_version()}, {platform.machine()}; medians of {repeats}; "
          f"pool of {WORKERS}; times per update in ms")
    print(f"{'params':>9} {'bytes':>11} {'encode':>7} {'decode':>7} {'sign':>6} {'verify':>7} {'open':>6} "
          f"{'open/pool':>10} {'latency':>8} {'pipelined':>10} {'(sign+verify)/codec':>20} {'pool/pipelined':>15}")
    verdicts = []
    for num_params in (127_000, 1_000_000):
        m = measure(num_params, repeats)
        messages = max(20, int(stream_bytes / m["bytes"]))
        pooled = pooled_open_seconds(num_params, messages)
        latency, pipelined = transport_seconds(bytes(int(m["bytes"]) + 100), messages)
        codec = m["encode"] + m["decode"]
        print(f"{num_params:>9,} {int(m['bytes']):>11,} {m['encode'] * 1e3:>7.2f} {m['decode'] * 1e3:>7.2f} "
              f"{m['sign'] * 1e3:>6.2f} {m['verify'] * 1e3:>7.2f} {m['open'] * 1e3:>6.2f} {pooled * 1e3:>10.2f} "
              f"{latency * 1e3:>8.2f} {pipelined * 1e3:>10.2f} {(m['sign'] + m['verify']) / codec:>20.2f} "
              f"{pooled / pipelined:>15.2f}")
        verdicts.append((num_params, pooled, pipelined, m["open"]))
    for num_params, pooled, pipelined, serial in verdicts:
        mark = "PASS" if pooled <= GOAL * pipelined else "MISS"
        print(f"{mark}  {num_params:,} params: opening an update (verify + decode + validate) on the pool takes "
              f"{pooled * 1e3:.2f} ms = {pooled / pipelined:.2f} x the pipelined transport per message "
              f"({pipelined * 1e3:.2f} ms; goal <= {GOAL}); one after another on the loop it took {serial * 1e3:.2f} ms "
              f"= {serial / pipelined:.2f} x")
    print("per round, the coordinator opens each update once (open: verify + decode; open/pool: the same on "
          f"{WORKERS} workers, wall time per update) and signs each family's state once; each agent signs one "
          "update and verifies one state")


if __name__ == "__main__":
    main()
