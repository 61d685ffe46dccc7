"""Array field types for message models and the shape checks against a model's layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
from pydantic import PlainSerializer, PlainValidator, StringConstraints
from pydantic_core import PydanticCustomError

from protocol.errors import ProtocolError, Reason


def _validate_array(value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise PydanticCustomError("not_array", "expected an array, got {type}", {"type": type(value).__name__})
    if value.dtype.kind in "fc" and value.size and not all_finite(value):
        raise PydanticCustomError("non_finite", "array holds NaN or Inf")
    return value


def all_finite(array: np.ndarray) -> bool:
    """No NaN or Inf in ``array``.

    Fast path for real float32/float64: a NaN or Inf anywhere makes the dot product of the
    array with itself non-finite, and BLAS computes it in one pass without a temporary. A
    finite dot proves every element finite; a non-finite one (possibly mere overflow of
    large values) falls back to the exact elementwise check. float16 is checked on its bits.
    """
    if array.dtype.kind == "f" and array.dtype.itemsize >= 4:
        flat = array.reshape(-1)
        with np.errstate(all="ignore"):
            if np.isfinite(np.dot(flat, flat)):
                return True
    elif array.dtype.kind == "f" and array.dtype.itemsize == 2:  # float16 math is emulated: test the bits
        bits = array.view(np.dtype(np.uint16).newbyteorder(array.dtype.byteorder))
        return not bool(((bits & 0x7C00) == 0x7C00).any())  # all exponent bits set: NaN or Inf
    return bool(np.isfinite(array).all())


Array = Annotated[np.ndarray, PlainValidator(_validate_array), PlainSerializer(lambda a: a)]
"""A numpy array field; floating arrays must hold only finite values."""

ARRAY_NAME_PATTERN = r"^[^:;\[\]\x00-\x1f\x7f]{1,256}$"
"""1 to 256 characters, none of them ``:`` ``;`` ``[`` ``]`` or a control character: the digest and the
layout fingerprint write ``name:dtype:shape;`` and ``[group]`` with no length prefix, so these would let
one set of arrays hash like another (an array named ``a:<f4:(1,);b`` fingerprints as two arrays)."""

ArrayName = Annotated[str, StringConstraints(pattern=ARRAY_NAME_PATTERN)]

Arrays = dict[ArrayName, Array]
"""Named arrays, e.g. a model's parameters in state-dict order."""

Layout = Mapping[str, tuple[tuple[int, ...], str]]
"""Expected name -> (shape, dtype string) of a set of named arrays."""


def layout_of(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (tuple(a.shape), a.dtype.str) for name, a in arrays.items()}


def check_layout(arrays: Mapping[str, np.ndarray], expected: Layout, what: str) -> None:
    """Raise BAD_SHAPE unless ``arrays`` has exactly the names, shapes and dtypes expected."""
    if arrays.keys() != expected.keys():
        missing = sorted(expected.keys() - arrays.keys())[:3]
        extra = sorted(arrays.keys() - expected.keys())[:3]
        raise ProtocolError(Reason.BAD_SHAPE, f"{what}: missing {missing}, unexpected {extra}")
    for name, array in arrays.items():
        shape, dtype = expected[name]
        if tuple(array.shape) != tuple(shape) or array.dtype.str != dtype:
            raise ProtocolError(
                Reason.BAD_SHAPE,
                f"{what}: {name} is {array.dtype.str}{list(array.shape)}, expected {dtype}{list(shape)}",
            )
