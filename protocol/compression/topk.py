"""``topk:F``: the ceil(F * n) entries of largest magnitude and their flat indices (8 bytes each).

:func:`protocol.compression.pack_arrays` selects them model-wide (n: all the arrays' entries,
one threshold), so an array may keep many entries or none; ``pack`` of one array keeps
ceil(F * its size). Biased on its own: agents use it with error feedback
(:mod:`protocol.compression.error_feedback`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from protocol.compression.registry import COMPRESSORS, Compressor, Packed, Spec, bad, check_values

FP32_MAX = float(np.finfo(np.float32).max)


def fraction(value: Any) -> float:
    """The fraction kept, from a spec's text after ``topk:`` or a number: finite, 0 < F <= 1."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError("topk needs a fraction, e.g. topk:0.01")
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"topk fraction {value!r} is not a number") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"topk fraction must be a number in (0, 1], got {value!r}")
    else:
        number = float(value)
    if not (math.isfinite(number) and 0 < number <= 1):
        raise ValueError("topk fraction must be in (0, 1]")
    return number


def _as_float32(values: np.ndarray) -> np.ndarray:
    return values if values.dtype == np.float32 else np.clip(values, -FP32_MAX, FP32_MAX).astype(np.float32)


def _pack(flat: np.ndarray, spec: Spec, rng: np.random.Generator) -> dict[str, Any]:
    n, k = flat.size, spec.kept(flat.size)
    if k == n:
        indices = np.arange(n, dtype=np.uint32)
    else:
        indices = np.argpartition(np.abs(flat), n - k)[n - k:].astype(np.uint32)
        indices.sort()
    return {"values": _as_float32(flat[indices]), "indices": indices}


def _pack_model_wide(arrays: Mapping[str, np.ndarray], spec: Spec) -> dict[str, dict[str, Any]]:
    """Top-k over all the (finite, flat-able) arrays at once: the ceil(F * total) largest magnitudes
    wherever they are.

    Per array, a small layer (a first convolution of a few hundred weights) would get only a few
    entries a round however large its changes; one model-wide threshold spends the budget where
    the update is. An array may get no entries (its packed form then holds none)."""
    flats = {name: np.ascontiguousarray(a).reshape(-1) for name, a in arrays.items()}
    sizes = [flat.size for flat in flats.values()]
    total = sum(sizes)
    k = spec.kept(total)
    magnitudes = np.concatenate([np.abs(flat, dtype=np.float64) for flat in flats.values()]) if total else np.zeros(0)
    chosen = np.arange(total) if k == total else np.sort(np.argpartition(magnitudes, total - k)[total - k:])
    offsets = np.cumsum([0, *sizes])
    bounds = np.searchsorted(chosen, offsets)  # chosen[bounds[i]:bounds[i + 1]] fall in array i
    packed: dict[str, dict[str, Any]] = {}
    for i, (name, flat) in enumerate(flats.items()):
        indices = (chosen[bounds[i]:bounds[i + 1]] - offsets[i]).astype(np.uint32)
        packed[name] = {"values": _as_float32(flat[indices]), "indices": indices}
    return packed


def _unpack(packed: Packed, dtype: np.dtype) -> np.ndarray:
    out = np.zeros(packed.size, dtype=dtype)
    out[packed.indices] = packed.values
    return out


def _check(packed: Packed) -> None:
    check_values(packed, ("f", (2, 4)), dense=False)
    indices, n = packed.indices, packed.size
    assert indices is not None  # PackedArray checked that the extras it declares travel
    if indices.ndim != 1 or indices.dtype.kind != "u" or indices.dtype.itemsize != 4:
        raise bad("schema", "topk indices must be a 1-D uint32 array, got {d}", d=indices.dtype.str)
    if indices.size != packed.values.size:
        raise bad("bad_shape", "{i} indices for {v} values", i=indices.size, v=packed.values.size)
    if indices.size and int(indices[-1]) >= n:
        raise bad("bad_shape", "topk index {i} outside {n} entries", i=int(indices[-1]), n=n)
    if indices.size > 1 and not bool((indices[1:] > indices[:-1]).all()):
        raise bad("schema", "topk indices must be strictly increasing")


COMPRESSORS.register(
    "topk", Compressor(_pack, _unpack, _check, usage="topk:F (0 < F <= 1)", extras=frozenset({"indices"}),
                       argument=fraction, pack_all=_pack_model_wide, error_feedback=True),
    summary="the fraction F of entries of largest magnitude, model-wide, the rest kept on the device as error feedback",
    payloads=("delta", "control_delta"))
