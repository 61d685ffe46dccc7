"""What signing costs: Ed25519 over a whole encoded update, against what a round spends anyway.

    python bench/signing.py            # 127k and 1M float32 parameters (0.5 and 4 MB updates)
    python bench/signing.py --quick    # fewer repetitions: seconds, for CI

Every agent seals its update (sign) and the coordinator opens it (verify) before decoding;
the coordinator signs each family's global state once per round and every agent verifies it.
Baselines measured in the same run: the plain codec work on the same message (encode +
validated decode), and carrying the message through a real Mosquitto on this machine
(publish to receipt, one subscriber): the round's time per update without signatures is at
least that transport. The coordinator verifies updates one after another on its loop, so
verify / transport is the share signatures add to a round's time when updates arrive back
to back. Exits 0 whatever the timings; 1 only if a sealed update does not open to what was sealed.
"""

from __future__ import annotations

import argparse
import platform
import threading

from codec import make_update, model_arrays
from timing import median_seconds

from launcher.broker import MosquittoBroker
from protocol.limits import DEFAULT_LIMITS
from protocol.messages import Signed, Update
from protocol.security.signing import SigningKey, single_key
from protocol.security.trust import Trust, decode_trusted
from protocol.transport.mqtt import BrokerAddress, MqttLink
from protocol.wire import decode_message, encode_message

GOAL = 0.5  # verify / transport: signatures add at most half to a round's time per update


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


def transport_seconds(payload: bytes, repeats: int) -> float:
    """Median time from publishing ``payload`` (QoS 1) to its receipt by another client, through Mosquitto."""
    arrived = threading.Event()
    with MosquittoBroker() as broker:
        address = BrokerAddress.parse(broker.url)
        receiver = MqttLink("receiver", address, lambda *_: arrived.set(), subscriptions=[("bench/#", 1)])
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

            return median_seconds({"transport": once}, repeats)["transport"]
        finally:
            sender.stop(), receiver.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 5 if args.quick else 21
    print(f"python {platform.python_version()}, {platform.machine()}; medians of {repeats}")
    print(f"{'params':>9} {'bytes':>11} {'encode ms':>10} {'decode ms':>10} {'sign ms':>8} {'verify ms':>10} "
          f"{'open ms':>8} {'transport ms':>13} {'(sign+verify)/codec':>20} {'verify/transport':>17}")
    verdicts = []
    for num_params in (127_000, 1_000_000):
        m = measure(num_params, repeats)
        transport = transport_seconds(bytes(int(m["bytes"]) + 100), repeats)
        codec = m["encode"] + m["decode"]
        print(f"{num_params:>9,} {int(m['bytes']):>11,} {m['encode'] * 1e3:>10.2f} {m['decode'] * 1e3:>10.2f} "
              f"{m['sign'] * 1e3:>8.2f} {m['verify'] * 1e3:>10.2f} {m['open'] * 1e3:>8.2f} {transport * 1e3:>13.2f} "
              f"{(m['sign'] + m['verify']) / codec:>20.2f} {m['verify'] / transport:>17.2f}")
        verdicts.append((num_params, m["verify"] / transport))
    for num_params, ratio in verdicts:
        mark = "PASS" if ratio <= GOAL else "MISS"
        print(f"{mark}  {num_params:,} params: verifying an update = {ratio:.2f} x carrying it through the broker "
              f"(goal <= {GOAL})")
    print("per round, the coordinator verifies each update once (the verify column) and signs each "
          "family's state once; each agent signs one update and verifies one state")


if __name__ == "__main__":
    main()
