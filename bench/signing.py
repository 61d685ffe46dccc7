"""What signing costs: Ed25519 over a whole encoded update, against encoding and decoding it.

    python bench/signing.py            # 1M float32 parameters (a 4 MB update), and 127k
    python bench/signing.py --quick    # fewer repetitions: seconds, for CI

Every agent seals its update (sign) and the coordinator opens it (verify) before decoding;
the coordinator signs each global state once per round and every agent verifies it. Times are
medians of repetitions in this process; the table gives each as a ratio to the plain codec
work on the same message (encode + validated decode), measured in the same run, and the
coordinator's extra CPU per round for N updates as a ratio to the codec work it does anyway.
Exits 0 whatever the timings; 1 only if a sealed update does not open to what was sealed.
"""

from __future__ import annotations

import argparse
import platform

from codec import make_update, model_arrays
from timing import median_seconds

from protocol.limits import DEFAULT_LIMITS
from protocol.messages import Signed, Update
from protocol.signing import SigningKey, single_key
from protocol.trust import Trust, decode_trusted
from protocol.wire import decode_message, encode_message

GOAL = 0.25  # sign + verify over codec time: at most a quarter more CPU per message


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 5 if args.quick else 21
    print(f"python {platform.python_version()}, {platform.machine()}; medians of {repeats}")
    print(f"{'params':>9} {'bytes':>11} {'encode ms':>10} {'decode ms':>10} {'sign ms':>8} {'verify ms':>10} "
          f"{'open ms':>8} {'(sign+verify)/codec':>20}")
    verdicts = []
    for num_params in (127_000, 1_000_000):
        m = measure(num_params, repeats)
        codec = m["encode"] + m["decode"]
        ratio = (m["sign"] + m["verify"]) / codec
        print(f"{num_params:>9,} {m['bytes']:>11,} {m['encode'] * 1e3:>10.2f} {m['decode'] * 1e3:>10.2f} "
              f"{m['sign'] * 1e3:>8.2f} {m['verify'] * 1e3:>10.2f} {m['open'] * 1e3:>8.2f} {ratio:>20.2f}")
        verdicts.append((num_params, ratio))
    for num_params, ratio in verdicts:
        mark = "PASS" if ratio <= GOAL else "MISS"
        print(f"{mark}  {num_params:,} params: sign + verify = {ratio:.2f} x encode + decode (goal <= {GOAL})")
    print("per round, the coordinator verifies each update once (the verify column) and signs each "
          "family's state once; each agent signs one update and verifies one state")


if __name__ == "__main__":
    main()
