"""Compressed model updates: fewer bytes on the air. Pure numpy, no torch.

- ``fp16``: half precision (2 bytes an entry); values past +-65504, float16's largest finite
  value, saturate there instead of becoming Inf.
- ``int8``: one scale per tensor (max|x| / 127) and stochastic rounding (1 byte an entry):
  unbiased, E[decoded] = x, and |decoded - x| <= scale.
- ``topk:F``: the ceil(F * n) entries of largest magnitude and their flat indices (8 bytes each).
  :func:`pack_arrays` selects them model-wide (n: all the arrays' entries, one threshold), so an
  array may keep many entries or none; :func:`pack` of one array keeps ceil(F * its size).
  Biased on its own: use it with error feedback (:mod:`protocol.compression.error_feedback`).

Only float32/float64 arrays are compressible. Integer arrays (e.g. BatchNorm's
``num_batches_tracked``) and float16 ones travel uncompressed next to the packed ones
(:func:`split_compressible`); :func:`pack_arrays` raises ValueError for them.

A receiver checks a packed payload against the layout it expects (:func:`check_packed_layout`)
before :func:`unpack`: top-k sends k values but unpacks prod(shape) entries, which the decode
limits never saw. :class:`PackedArray` bounds prod(shape) by ``MAX_PACKED_ELEMENTS`` regardless.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from protocol.arrays import Array, Layout, all_finite
from protocol.compression.spec import Compression, CompressionSpec
from protocol.errors import ProtocolError, Reason
from protocol.wire_model import WireModel

__all__ = ["MAX_PACKED_ELEMENTS", "Compression", "CompressionSpec", "PackedArray",
           "check_packed_layout", "half_precision", "pack", "pack_arrays", "packed_bytes", "raw_bytes",
           "split_compressible", "to_float16", "unpack", "unpack_arrays", "widen_half"]

MAX_PACKED_ELEMENTS = 2**31
"""The most entries one packed array may declare (prod(shape)), checked before anything allocates."""
MAX_NDIM = 8
FP16_MAX = float(np.finfo(np.float16).max)  # 65504
FP32_MAX = float(np.finfo(np.float32).max)
INT8_LEVELS = 127


def _bad(reason: str, text: str, **context: object) -> PydanticCustomError:
    return PydanticCustomError(reason, text, context or None)


class PackedArray(WireModel):
    """One compressed float array on the wire; validation checks every size before anything allocates."""

    kind: Literal["fp16", "int8", "topk"]
    shape: list[Annotated[int, Field(ge=0, le=MAX_PACKED_ELEMENTS)]] = Field(max_length=MAX_NDIM)
    dtype: Literal["<f4", "<f8"]
    """The dtype :func:`unpack` restores."""
    values: Array
    """fp16: float16 [n], n = prod(shape); int8: int8 [n] in [-127, 127]; topk: float32 or float16 [k]."""
    scale: float | None = None
    """int8 only: decoded = values * scale; finite, > 0."""
    indices: Array | None = None
    """topk only: uint32 [k], strictly increasing flat indices, each < n."""

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @model_validator(mode="after")
    def _check(self) -> PackedArray:
        n, values, indices = self.size, self.values, self.indices
        if n > MAX_PACKED_ELEMENTS:
            raise _bad("bad_shape", "shape {s} holds over {m} entries", s=self.shape, m=MAX_PACKED_ELEMENTS)
        if values.ndim != 1:
            raise _bad("bad_shape", "values must be 1-D, got {d} dimensions", d=values.ndim)
        if (self.scale is not None) != (self.kind == "int8"):
            raise _bad("schema", "scale travels with int8 and nothing else")
        if (indices is not None) != (self.kind == "topk"):
            raise _bad("schema", "indices travel with topk and nothing else")
        want = {"fp16": ("f", (2,)), "int8": ("i", (1,)), "topk": ("f", (2, 4))}[self.kind]
        if values.dtype.kind != want[0] or values.dtype.itemsize not in want[1]:
            raise _bad("schema", "{k} values cannot be {d}", k=self.kind, d=values.dtype.str)
        if self.kind != "topk" and values.size != n:
            raise _bad("bad_shape", "{c} values for shape {s}", c=values.size, s=self.shape)
        if self.kind == "int8":
            assert self.scale is not None
            dtype = np.dtype(self.dtype)
            if not (dtype.type(self.scale) > 0 and _int8_decodes_finite(self.scale, dtype)):
                raise _bad("schema", "int8 scale {x} is 0 or 127 * scale overflows {d}", x=self.scale, d=self.dtype)
            if values.size and int(values.min()) < -INT8_LEVELS:
                raise _bad("schema", "int8 values must lie in [-127, 127]")
        if indices is not None:
            if indices.ndim != 1 or indices.dtype.kind != "u" or indices.dtype.itemsize != 4:
                raise _bad("schema", "topk indices must be a 1-D uint32 array, got {d}", d=indices.dtype.str)
            if indices.size != values.size:
                raise _bad("bad_shape", "{i} indices for {v} values", i=indices.size, v=values.size)
            if indices.size and int(indices[-1]) >= n:
                raise _bad("bad_shape", "topk index {i} outside {n} entries", i=int(indices[-1]), n=n)
            if indices.size > 1 and not bool((indices[1:] > indices[:-1]).all()):
                raise _bad("schema", "topk indices must be strictly increasing")
        return self


def _spec(spec: CompressionSpec | str) -> CompressionSpec:
    return spec if isinstance(spec, CompressionSpec) else CompressionSpec.parse(spec)


def pack(array: np.ndarray, spec: CompressionSpec | str, rng: np.random.Generator | None = None) -> PackedArray:
    """Compress one float32/float64 array. ``rng`` drives int8's stochastic rounding (a fresh one if None).

    Raises ValueError for kind ``none``, other dtypes, NaN or Inf, or arrays over the size bounds."""
    spec = _spec(spec)
    if spec.kind == "none":
        raise ValueError("compression 'none' packs nothing: send the array as it is")
    if array.dtype.kind != "f" or array.dtype.itemsize not in (4, 8):
        raise ValueError(f"only float32/float64 arrays are compressible, got {array.dtype}")
    if array.ndim > MAX_NDIM or array.size > MAX_PACKED_ELEMENTS:
        raise ValueError(f"array of shape {array.shape} is over the packed bounds")
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.size and not all_finite(flat):
        raise ValueError("array holds NaN or Inf")
    fields: dict = {"kind": spec.kind, "shape": list(array.shape), "dtype": f"<f{array.dtype.itemsize}"}
    if spec.kind == "fp16":
        fields["values"] = to_float16(flat)
    elif spec.kind == "int8":
        scale = _int8_scale(float(np.abs(flat).max()) if flat.size else 0.0, flat.dtype)
        scaled = flat / flat.dtype.type(scale)
        low = np.floor(scaled)
        scaled -= low  # the fraction: round up with this probability, so E[q] = x / scale
        rng = rng if rng is not None else np.random.default_rng()
        low += rng.random(flat.size, dtype=flat.dtype.type) < scaled
        fields["values"] = np.clip(low, -INT8_LEVELS, INT8_LEVELS, out=low).astype(np.int8)
        fields["scale"] = scale
    else:
        n, k = flat.size, spec.kept(flat.size)
        if k == n:
            indices = np.arange(n, dtype=np.uint32)
        else:
            indices = np.argpartition(np.abs(flat), n - k)[n - k:].astype(np.uint32)
            indices.sort()
        values = flat[indices]
        if values.dtype != np.float32:
            values = np.clip(values, -FP32_MAX, FP32_MAX).astype(np.float32)
        fields["values"], fields["indices"] = values, indices
    return PackedArray(**fields)


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
    floats, rest = split_compressible(arrays)
    halves = {name: to_float16(array) for name, array in floats.items()}
    return {name: halves[name] if name in halves else rest[name] for name in arrays}


def widen_half(arrays: Mapping[str, np.ndarray], expected: Layout) -> dict[str, np.ndarray]:
    """Receivers' side of :func:`half_precision`: a float16 array where ``expected`` holds a wider
    float becomes that dtype (lossless); every other array is left for the layout check to judge."""
    out = dict(arrays)
    for name, array in arrays.items():
        want = expected.get(name)
        if want is not None and array.dtype == np.float16 and want[1] in ("<f4", "<f8"):
            out[name] = array.astype(np.dtype(want[1]))
    return out


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


def unpack(packed: PackedArray) -> np.ndarray:
    """The dense array ``packed`` stands for, float32 or float64 as its ``dtype`` says (a new array)."""
    dtype = np.dtype(packed.dtype)
    if packed.kind == "topk":
        out = np.zeros(packed.size, dtype=dtype)
        out[packed.indices] = packed.values
    else:
        out = packed.values.astype(dtype)
        if packed.kind == "int8":
            out *= dtype.type(packed.scale)
    return out.reshape(packed.shape)


def split_compressible(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(float32/float64 arrays, the rest): what :func:`pack_arrays` takes, and what travels uncompressed."""
    floats = {n: a for n, a in arrays.items() if a.dtype.kind == "f" and a.dtype.itemsize in (4, 8)}
    return floats, {n: a for n, a in arrays.items() if n not in floats}


def pack_arrays(arrays: Mapping[str, np.ndarray], spec: CompressionSpec | str,
                rng: np.random.Generator | None = None) -> dict[str, PackedArray]:
    """Compress named float arrays. Raises ValueError for any other array: integer counters are not
    compressible, and callers send them uncompressed (:func:`split_compressible`)."""
    spec = _spec(spec)
    floats, others = split_compressible(arrays)
    if others:
        name = next(iter(others))
        raise ValueError(f"{name}: {others[name].dtype} arrays are not compressible; send them uncompressed")
    rng = rng if rng is not None else np.random.default_rng()
    if spec.kind == "topk" and len(floats) > 1:
        return _pack_topk_model_wide(floats, spec)
    return {name: pack(array, spec, rng) for name, array in floats.items()}


def _pack_topk_model_wide(arrays: Mapping[str, np.ndarray], spec: CompressionSpec) -> dict[str, PackedArray]:
    """Top-k over all the arrays at once: the ceil(F * total) largest magnitudes wherever they are.

    Per array, a small layer (a first convolution of a few hundred weights) would get only a few
    entries a round however large its changes; one model-wide threshold spends the budget where
    the update is. An array may get no entries (its packed form then holds none)."""
    for name, array in arrays.items():
        if array.ndim > MAX_NDIM or array.size > MAX_PACKED_ELEMENTS:
            raise ValueError(f"{name}: array of shape {array.shape} is over the packed bounds")
        if array.size and not all_finite(array):
            raise ValueError(f"{name}: array holds NaN or Inf")
    flats = {name: np.ascontiguousarray(a).reshape(-1) for name, a in arrays.items()}
    sizes = [flat.size for flat in flats.values()]
    total = sum(sizes)
    k = spec.kept(total)
    magnitudes = np.concatenate([np.abs(flat, dtype=np.float64) for flat in flats.values()]) if total else np.zeros(0)
    chosen = np.arange(total) if k == total else np.sort(np.argpartition(magnitudes, total - k)[total - k:])
    offsets = np.cumsum([0, *sizes])
    bounds = np.searchsorted(chosen, offsets)  # chosen[bounds[i]:bounds[i + 1]] fall in array i
    packed: dict[str, PackedArray] = {}
    for i, (name, flat) in enumerate(flats.items()):
        indices = (chosen[bounds[i]:bounds[i + 1]] - offsets[i]).astype(np.uint32)
        values = flat[indices]
        if values.dtype != np.float32:
            values = np.clip(values, -FP32_MAX, FP32_MAX).astype(np.float32)
        packed[name] = PackedArray(kind="topk", shape=list(arrays[name].shape), dtype=f"<f{flat.dtype.itemsize}",
                                   values=values, indices=indices)
    return packed


def unpack_arrays(packed: Mapping[str, PackedArray]) -> dict[str, np.ndarray]:
    return {name: unpack(p) for name, p in packed.items()}


def packed_layout(packed: Mapping[str, PackedArray]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (tuple(p.shape), p.dtype) for name, p in packed.items()}


def check_packed_layout(packed: Mapping[str, PackedArray], expected: Layout, what: str) -> None:
    """Raise BAD_SHAPE unless ``packed`` unpacks to exactly the names, shapes and dtypes expected.
    Call it before :func:`unpack`, which allocates what the shapes declare."""
    layout = packed_layout(packed)
    if layout.keys() != expected.keys():
        missing, extra = sorted(expected.keys() - layout.keys())[:3], sorted(layout.keys() - expected.keys())[:3]
        raise ProtocolError(Reason.BAD_SHAPE, f"{what}: missing {missing}, unexpected {extra}")
    for name, (shape, dtype) in layout.items():
        want_shape, want_dtype = expected[name]
        if shape != tuple(want_shape) or dtype != want_dtype:
            raise ProtocolError(Reason.BAD_SHAPE,
                                f"{what}: {name} unpacks to {dtype}{list(shape)}, expected {want_dtype}{list(want_shape)}")


def raw_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    """What the arrays cost uncompressed (their float32/float64 data)."""
    return sum(int(a.nbytes) for a in arrays.values())


def packed_bytes(packed: Mapping[str, PackedArray]) -> int:
    """The data bytes the packed arrays carry (values, indices and scale; framing not counted)."""
    return sum(int(p.values.nbytes) + (0 if p.indices is None else int(p.indices.nbytes))
               + (0 if p.scale is None else 8) for p in packed.values())
