"""Per-status decode cost on the coordinator: signed agent statuses through the path intake uses.

Prints CPU microseconds per status (``time.process_time``) for decoding N signed statuses with
``decode_trusted`` (verify + decode + validate) and for unsigned ones, e.g.::

    python bench/status_decode.py --count 20000
"""

from __future__ import annotations

import argparse
import time

from coordinator.admission.intake import status_limits
from protocol.fields import TaskRef
from protocol.messages import AgentStatus
from protocol.reader import read_message
from protocol.security.signing import SigningKey
from protocol.security.trust import Trust, decode_trusted
from protocol.wire import encode_message

LAYOUT = "0" * 32


def _statuses(count: int, key: SigningKey | None) -> list[bytes]:
    task = TaskRef(name="bench", version="1.0.0")
    out = []
    for i in range(count):
        payload = encode_message(AgentStatus(
            agent_id=f"agent-{i:06d}", state="online", device="cpu", family="mlp", num_samples=100 + i % 50,
            num_eval_samples=20, version="1.0.0", timestamp=time.time(), session="s" * 16,
            task_ref=task, layout=LAYOUT, epoch=1, seq=i + 1))
        out.append(encode_message(key.seal(payload)) if key is not None else payload)
    return out


def _per_status_us(payloads: list[bytes], trust: Trust | None, repeats: int) -> float:
    """CPU microseconds per payload, fastest pass; ``trust`` None: the msgpack reader alone."""
    limits = status_limits(10)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        if trust is None:
            for payload in payloads:
                read_message(payload, limits)
        else:
            for payload in payloads:
                decode_trusted(payload, AgentStatus, limits, trust)
        best = min(best, time.process_time() - start)
    return best / len(payloads) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000, help="statuses per pass")
    parser.add_argument("--repeats", type=int, default=3, help="passes; the fastest is reported")
    args = parser.parse_args()
    key = SigningKey.generate()
    enrolled = {key.public_key.key_id: ("agent", key.public_key)}
    trust = Trust(lookup=enrolled.get, required=True)
    signed = _per_status_us(_statuses(args.count, key), trust, args.repeats)
    plain = _statuses(args.count, None)
    unsigned = _per_status_us(plain, Trust(), args.repeats)
    read = _per_status_us(plain, None, args.repeats)
    print("| statuses | signed, verified | unsigned | msgpack reader alone |  (us CPU per status)\n|---|---|---|---|\n"
          f"| {args.count} | {signed:.1f} | {unsigned:.1f} | {read:.1f} |")


if __name__ == "__main__":
    main()
