"""Compressed model updates: fewer bytes on the air. Pure numpy, no torch.

The compressors themselves are registered one a file (``fp16.py``, ``int8.py``, ``topk.py``,
:mod:`protocol.compression.registry`); this module holds what they share: the wire form of a
packed array, and packing and unpacking dispatched by kind.

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
from pydantic import Field, StringConstraints, model_validator

from protocol.arrays import Array, Layout, all_finite
from protocol.compression.fp16 import half_precision, to_float16, widen_half  # re-exported
from protocol.compression.registry import COMPRESSORS, PACKED_EXTRAS, Compressor, bad
from protocol.compression.spec import OPEN_KIND, Compression, CompressionSpec
from protocol.errors import ProtocolError, Reason
from protocol.registry import UnknownName
from protocol.wire_model import WireModel

__all__ = ["MAX_PACKED_ELEMENTS", "Compression", "CompressionSpec", "PackedArray",
           "check_packed_layout", "half_precision", "pack", "pack_arrays", "packed_bytes", "raw_bytes",
           "split_compressible", "to_float16", "unpack", "unpack_arrays", "widen_half"]

MAX_PACKED_ELEMENTS = 2**31
"""The most entries one packed array may declare (prod(shape)), checked before anything allocates."""
MAX_NDIM = 8


class PackedArray(WireModel):
    """One compressed float array on the wire; validation checks every size before anything allocates."""

    kind: Annotated[str, StringConstraints(pattern=rf"^{OPEN_KIND.pattern}$")]
    """A registered compressor (:data:`~protocol.compression.registry.COMPRESSORS`); another is ``schema``."""
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
        compressor = _compressor(self.kind)
        if self.size > MAX_PACKED_ELEMENTS:
            raise bad("bad_shape", "shape {s} holds over {m} entries", s=self.shape, m=MAX_PACKED_ELEMENTS)
        if self.values.ndim != 1:
            raise bad("bad_shape", "values must be 1-D, got {d} dimensions", d=self.values.ndim)
        for extra in PACKED_EXTRAS:
            if (getattr(self, extra) is not None) != (extra in compressor.extras):
                users = [entry.name for entry in COMPRESSORS if extra in entry.value.extras]
                raise bad("schema", "{x} travels with {k} and nothing else", x=extra, k=" or ".join(users) or "no kind")
        compressor.check(self)
        return self


def _compressor(kind: str) -> Compressor:
    try:
        return COMPRESSORS.get(kind)
    except UnknownName as exc:  # a kind only the coordinator that announced it could unpack
        raise bad("schema", "{problem}", problem=str(exc)) from None


def _spec(spec: CompressionSpec | str) -> CompressionSpec:
    return spec if isinstance(spec, CompressionSpec) else CompressionSpec.parse(spec)


def _check_packable(array: np.ndarray, what: str = "") -> np.ndarray:
    """``array`` flat, or ValueError for another dtype, NaN or Inf, or sizes over the packed bounds."""
    if array.dtype.kind != "f" or array.dtype.itemsize not in (4, 8):
        raise ValueError(f"{what}only float32/float64 arrays are compressible, got {array.dtype}")
    if array.ndim > MAX_NDIM or array.size > MAX_PACKED_ELEMENTS:
        raise ValueError(f"{what}array of shape {array.shape} is over the packed bounds")
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.size and not all_finite(flat):
        raise ValueError(f"{what}array holds NaN or Inf")
    return flat


def _packed(kind: str, array: np.ndarray, fields: dict) -> PackedArray:
    return PackedArray(kind=kind, shape=list(array.shape), dtype=f"<f{array.dtype.itemsize}", **fields)


def pack(array: np.ndarray, spec: CompressionSpec | str, rng: np.random.Generator | None = None) -> PackedArray:
    """Compress one float32/float64 array. ``rng`` drives int8's stochastic rounding (a fresh one if None).

    Raises ValueError for kind ``none``, other dtypes, NaN or Inf, or arrays over the size bounds."""
    spec = _spec(spec)
    if spec.kind == "none":
        raise ValueError("compression 'none' packs nothing: send the array as it is")
    flat = _check_packable(array)
    fields = COMPRESSORS.get(spec.kind).pack(flat, spec, rng if rng is not None else np.random.default_rng())
    return _packed(spec.kind, array, fields)


def unpack(packed: PackedArray) -> np.ndarray:
    """The dense array ``packed`` stands for, float32 or float64 as its ``dtype`` says (a new array)."""
    return COMPRESSORS.get(packed.kind).unpack(packed, np.dtype(packed.dtype)).reshape(packed.shape)


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
    compressor = COMPRESSORS.get(spec.kind) if spec.kind != "none" else None
    if compressor is not None and compressor.pack_all is not None and len(floats) > 1:
        for name, array in floats.items():
            _check_packable(array, f"{name}: ")
        fields = compressor.pack_all(floats, spec)
        return {name: _packed(spec.kind, array, fields[name]) for name, array in floats.items()}
    return {name: pack(array, spec, rng) for name, array in floats.items()}


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
