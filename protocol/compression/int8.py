"""``int8``: one scale per tensor (max|x| / 127) and stochastic rounding, 1 byte an entry.

Unbiased, E[decoded] = x, and |decoded - x| <= scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol.compression.registry import COMPRESSORS, Compressor, Packed, Spec, bad, check_values

INT8_LEVELS = 127


def _int8_scale(peak: float, dtype: np.dtype) -> float:
    """max|x| / 127 as a number of ``dtype``, so that decoding multiplies by it exactly; at least
    the smallest normal number (no precision lost to subnormals), small enough that 127 * scale is finite."""
    if peak == 0:
        return 1.0
    scale = dtype.type(max(peak / INT8_LEVELS, float(np.finfo(dtype).tiny)))
    while not _int8_decodes_finite(scale, dtype):
        scale = np.nextafter(scale, dtype.type(0))
    return float(scale)


def _int8_decodes_finite(scale: float, dtype: np.dtype) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.isfinite(dtype.type(scale) * dtype.type(INT8_LEVELS)))


def _pack(flat: np.ndarray, spec: Spec, rng: np.random.Generator) -> dict[str, Any]:
    scale = _int8_scale(float(np.abs(flat).max()) if flat.size else 0.0, flat.dtype)
    scaled = flat / flat.dtype.type(scale)
    low = np.floor(scaled)
    scaled -= low  # the fraction: round up with this probability, so E[q] = x / scale
    low += rng.random(flat.size, dtype=flat.dtype.type) < scaled
    return {"values": np.clip(low, -INT8_LEVELS, INT8_LEVELS, out=low).astype(np.int8), "scale": scale}


def _unpack(packed: Packed, dtype: np.dtype) -> np.ndarray:
    out = packed.values.astype(dtype)
    out *= dtype.type(packed.scale)
    return out


def _check(packed: Packed) -> None:
    check_values(packed, ("i", (1,)), dense=True)
    assert packed.scale is not None  # PackedArray checked that the extras it declares travel
    dtype = np.dtype(packed.dtype)
    with np.errstate(over="ignore"):  # a scale past the dtype's range casts to inf: refused just below
        positive = dtype.type(packed.scale) > 0
    if not (positive and _int8_decodes_finite(packed.scale, dtype)):
        raise bad("schema", "int8 scale {x} is 0 or 127 * scale overflows {d}", x=packed.scale, d=packed.dtype)
    if packed.values.size and int(packed.values.min()) < -INT8_LEVELS:
        raise bad("schema", "int8 values must lie in [-127, 127]")


COMPRESSORS.register(
    "int8", Compressor(_pack, _unpack, _check, usage="int8", extras=frozenset({"scale"})),
    summary="1 byte an entry, a scale per tensor, stochastic rounding (unbiased)",
    payloads=("delta", "control_delta"))
