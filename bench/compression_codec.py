"""Encode and decode cost and wire bytes of each update compression, for one float32 array.

    python bench/compression_codec.py               # 1M entries, 5 repetitions
    python bench/compression_codec.py --n 10000000 --repeats 3

encode: pack (protocol/compression/packing.py) plus the msgpack encoding of the packed array; decode:
msgpack decoding, PackedArray validation and unpacking to a dense float32 array. ``none`` is the
plain array through the codec (decoding is a zero-copy view). bytes: the encoded size. Times are
medians (time.perf_counter); nothing is asserted about them: machines differ.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from protocol.codec import decode, encode
from protocol.compression import PackedArray, pack, unpack

KINDS = ("none", "fp16", "int8", "topk:0.1", "topk:0.01")


def _median_ms(operation: Callable[[], Any], repeats: int) -> float:
    operation()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        operation()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def codec_times(n: int = 1_000_000, repeats: int = 5, seed: int = 0) -> list[tuple[str, float, float, int]]:
    """(kind, encode ms, decode ms, encoded bytes) per kind, for ``n`` standard-normal float32 entries."""
    rng = np.random.default_rng(seed)
    array = rng.standard_normal(n, dtype=np.float32)
    rows: list[tuple[str, float, float, int]] = []
    for kind in KINDS:
        if kind == "none":
            def encode_once() -> bytes:
                return encode(array)

            def decode_once(payload: bytes) -> np.ndarray:
                return decode(payload)
        else:
            def encode_once(kind: str = kind) -> bytes:
                return encode(pack(array, kind, rng).model_dump(mode="python"))

            def decode_once(payload: bytes) -> np.ndarray:
                return unpack(PackedArray.model_validate(decode(payload)))
        payload = encode_once()
        restored = decode_once(payload)
        if restored.shape != array.shape or restored.dtype != array.dtype:
            raise AssertionError(f"{kind}: decoded {restored.dtype}{restored.shape}")
        encode_ms = _median_ms(encode_once, repeats)
        decode_ms = _median_ms(lambda payload=payload, decode_once=decode_once: decode_once(payload), repeats)
        rows.append((kind, encode_ms, decode_ms, len(payload)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="entries of the float32 array")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = codec_times(args.n, args.repeats)
    raw = rows[0][3]
    print(f"{args.n:,} float32 entries, medians of {args.repeats}")
    print(f"{'kind':<10} {'encode ms':>10} {'decode ms':>10} {'bytes':>12} {'of none':>8}")
    for kind, encode_ms, decode_ms, nbytes in rows:
        print(f"{kind:<10} {encode_ms:>10.2f} {decode_ms:>10.2f} {nbytes:>12,} {nbytes / raw:>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
