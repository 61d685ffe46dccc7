"""``fp16``: half precision, 2 bytes an entry; also the form of a global state published with
``state_compression: fp16`` (:func:`half_precision`, widened back by :func:`widen_half`).

Values past +-65504, float16's largest finite value, saturate there instead of becoming Inf.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from protocol.arrays import Layout
from protocol.compression.registry import COMPRESSORS, Compressor, Packed, Spec, check_values

FP16_MAX = float(np.finfo(np.float16).max)  # 65504


def to_float16(array: np.ndarray) -> np.ndarray:
    """``array`` (finite floats) rounded to float16; values past +-65504 saturate there instead of
    becoming Inf. Used for fp16 updates and for global states published in half precision."""
    with np.errstate(over="ignore"):
        values = array.astype(np.float16)
    overflowed = (values.view(np.uint16) & 0x7C00) == 0x7C00  # all exponent bits: +-Inf, as x was finite
    if overflowed.any():  # saturate (np.clip on float16 is emulated and slow: only where needed)
        values[overflowed] = np.where(array[overflowed] > 0, FP16_MAX, -FP16_MAX)
    return values


def half_precision(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float32/float64 arrays as float16 (:func:`to_float16`), the others as they are: the form of a
    global state published with ``--state-compression fp16``."""
    halves = {name: to_float16(a) for name, a in arrays.items() if a.dtype.kind == "f" and a.dtype.itemsize in (4, 8)}
    return {name: halves[name] if name in halves else array for name, array in arrays.items()}


def widen_half(arrays: Mapping[str, np.ndarray], expected: Layout) -> dict[str, np.ndarray]:
    """Receivers' side of :func:`half_precision`: a float16 array where ``expected`` holds a wider
    float becomes that dtype (lossless); every other array is left for the layout check to judge."""
    out = dict(arrays)
    for name, array in arrays.items():
        want = expected.get(name)
        if want is not None and array.dtype == np.float16 and want[1] in ("<f4", "<f8"):
            out[name] = array.astype(np.dtype(want[1]))
    return out


def _pack(flat: np.ndarray, spec: Spec, rng: np.random.Generator) -> dict[str, Any]:
    return {"values": to_float16(flat)}


def _unpack(packed: Packed, dtype: np.dtype) -> np.ndarray:
    return packed.values.astype(dtype)


def _check(packed: Packed) -> None:
    check_values(packed, ("f", (2,)), dense=True)


COMPRESSORS.register(
    "fp16", Compressor(_pack, _unpack, _check, usage="fp16"),
    summary="half precision, 2 bytes an entry, saturating at +-65504 (also a global state's form)",
    payloads=("delta", "control_delta", "global_state"))
