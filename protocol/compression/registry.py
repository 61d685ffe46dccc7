"""The registry of update compressors: one file each (``fp16.py``, ``int8.py``, ``topk.py``).

A compressor is named on the wire by ``RoundAnnouncement.compression`` (``kind`` or ``kind:N``)
and by ``PackedArray.kind``. The name is an open set: a receiver that does not know a kind still
decodes the announcement and declines it (``Update.compression_declined``), so adding one here
never breaks an older agent. A packed array of an unknown kind is refused (``schema``): only the
coordinator, which announced the kind, unpacks.

Each entry's value is a :class:`Compressor`; its compatibility names the ``payloads`` it may
compress: ``delta``, ``control_delta`` (SCAFFOLD) and ``global_state`` (the coordinator's
``state_compression``). Adding a compressor is one file that registers itself, plus its import
in ``protocol/compression/__init__.py``; third parties register through ``edgefl.compressors``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from pydantic_core import PydanticCustomError

from protocol.registry import Registry

PACKED_EXTRAS = ("scale", "indices")
"""``PackedArray``'s optional fields; a compressor declares which of them it fills."""


class Packed(Protocol):
    """What a compressor reads of a ``PackedArray`` (typed structurally: no import of the model)."""

    kind: str
    shape: list[int]
    dtype: str
    values: np.ndarray
    scale: float | None
    indices: np.ndarray | None

    @property
    def size(self) -> int: ...


class Spec(Protocol):
    """What a compressor reads of a ``CompressionSpec``."""

    kind: str
    fraction: float | None

    def kept(self, n: int) -> int: ...


PackFn = Callable[[np.ndarray, Spec, np.random.Generator], dict[str, Any]]
"""(finite flat float32/float64 array, spec, rng) -> the fields ``values`` and the extras it uses."""
PackAllFn = Callable[[Mapping[str, np.ndarray], Spec], dict[str, dict[str, Any]]]
UnpackFn = Callable[[Packed, np.dtype], np.ndarray]
CheckFn = Callable[[Packed], None]


@dataclass(frozen=True)
class Compressor:
    pack: PackFn
    unpack: UnpackFn
    """The flat dense array of ``dtype`` that a (validated) packed array stands for."""
    check: CheckFn
    """The kind's own wire rules on a packed array, raising :func:`bad` errors; the shape bound,
    1-D values and which extras travel are checked by ``PackedArray`` for every kind."""
    usage: str
    """How its spec is written, for help and error messages: ``fp16``, ``topk:F (0 < F <= 1)``."""
    extras: frozenset[str] = frozenset()
    """Which of :data:`PACKED_EXTRAS` its packed arrays carry (and no others)."""
    argument: Callable[[Any], float] | None = None
    """Validates the number after ``:`` (text from a spec string, or a number) and returns it as a
    float, raising ValueError naming the problem; None: the kind takes no argument."""
    pack_all: PackAllFn | None = None
    """Packs several named arrays together (top-k selects model-wide); None: one array at a time."""
    error_feedback: bool = False
    """Biased on its own: the agent keeps what it dropped and sends it later (and the coordinator
    wants local momentum 0, or the held-back mass goes out in bursts)."""


COMPRESSORS: Registry[Compressor] = Registry("compressor", "edgefl.compressors")
"""Keyed by the kind named on the wire; ``none`` (no compression) is not an entry."""


def bad(reason: str, text: str, **context: object) -> PydanticCustomError:
    """A validation error whose type is a protocol reason (``schema``, ``bad_shape``)."""
    return PydanticCustomError(reason, text, context or None)


def check_values(packed: Packed, kind_and_sizes: tuple[str, tuple[int, ...]], dense: bool) -> None:
    """``values``' dtype kind and item sizes, and for a ``dense`` kind one value per entry."""
    values = packed.values
    if values.dtype.kind != kind_and_sizes[0] or values.dtype.itemsize not in kind_and_sizes[1]:
        raise bad("schema", "{k} values cannot be {d}", k=packed.kind, d=values.dtype.str)
    if dense and values.size != packed.size:
        raise bad("bad_shape", "{c} values for shape {s}", c=values.size, s=packed.shape)


def described() -> str:
    """``usage: summary`` of every compressor, for a setting's help."""
    return "; ".join(f"{entry.value.usage}: {entry.summary}" for entry in COMPRESSORS)


def state_compressors() -> tuple[str, ...]:
    """The kinds that may compress a published global state (``state_compression``)."""
    return tuple(e.name for e in COMPRESSORS if "global_state" in e.compatible.get("payloads", ()))
