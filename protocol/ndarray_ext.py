"""numpy arrays as msgpack extension type ``EXT_NDARRAY``: both directions of the layout.

    u8 ndim | u8 len(dtype) | u8 pad | dtype (ASCII, e.g. "<f4") | pad zero bytes
    | ndim x u64 little-endian dims | raw little-endian C-order data

``pad`` (0-15) puts the data at a multiple of 16 bytes from the start of the message, so a
decoded array is an aligned, read-only view straight into the received payload.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from protocol.errors import ProtocolError, Reason
from protocol.limits import DecodeLimits

EXT_NDARRAY = 1
ALIGNMENT = 16
HEADER_FIXED = 3
"""ndim, len(dtype), pad."""
EXT32_PREFIX = 6
MAX_DIM = 2**62

_FIXEXT_MARKERS = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


def as_wire_array(array: np.ndarray) -> np.ndarray:
    """``array`` as it travels: little-endian, C order (0-d arrays stay 0-d). Encoding and
    digests both use this, so a digest taken before sending matches one taken on receipt."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.require(array, requirements="C")


def ext_prefix(length: int) -> bytes:
    """msgpack framing for an ext value of ``length`` bytes (spec: fixext / ext 8/16/32)."""
    if length in _FIXEXT_MARKERS:
        return struct.pack(">Bb", _FIXEXT_MARKERS[length], EXT_NDARRAY)
    if length < 1 << 8:
        return struct.pack(">BBb", 0xC7, length, EXT_NDARRAY)
    if length < 1 << 16:
        return struct.pack(">BHb", 0xC8, length, EXT_NDARRAY)
    if length < 1 << 32:
        return struct.pack(">BIb", 0xC9, length, EXT_NDARRAY)
    raise ValueError(f"array of {length} bytes exceeds one msgpack ext value (4 GiB)")


def array_parts(array: np.ndarray, offset: int) -> list[bytes | memoryview]:
    """The msgpack framing, header and data of ``array`` placed ``offset`` bytes into a message."""
    if array.dtype.hasobject or array.dtype.fields is not None:
        raise TypeError(f"cannot encode arrays of dtype {array.dtype}")
    array = as_wire_array(array)
    dtype = array.dtype.str.encode("ascii")
    dims = struct.pack(f"<{array.ndim}Q", *array.shape)
    fixed = HEADER_FIXED + len(dtype) + len(dims)
    for pad in range(ALIGNMENT):  # the smallest pad that aligns, with msgpack's shortest framing
        prefix = ext_prefix(fixed + pad + array.nbytes)
        if (offset + len(prefix) + fixed + pad) % ALIGNMENT == 0:
            break
    else:  # the pad would cross a framing size class: ext 32 frames any length
        pad = -(offset + EXT32_PREFIX + fixed) % ALIGNMENT
        prefix = struct.pack(">BIb", 0xC9, fixed + pad + array.nbytes, EXT_NDARRAY)
    head = bytes((array.ndim, len(dtype), pad)) + dtype + b"\0" * pad + dims
    return [prefix, head, memoryview(array).cast("B")] if array.size else [prefix, head]


class ArrayBudget:
    """Elements one message may still declare, across all its arrays."""

    def __init__(self, limits: DecodeLimits) -> None:
        self.limits = limits
        self.elements_left = limits.max_total_elements


def read_array(buffer: memoryview, start: int, length: int, budget: ArrayBudget) -> np.ndarray:
    """The array in ext payload ``buffer[start:start + length]``, as a read-only view of ``buffer``.

    Every declared size is checked against the limits before the view is made.
    """
    limits = budget.limits
    end = start + length
    if length < HEADER_FIXED:
        raise ProtocolError(Reason.MALFORMED, "array header truncated")
    ndim, dtype_len, pad = buffer[start], buffer[start + 1], buffer[start + 2]
    if ndim > limits.max_ndim:
        raise ProtocolError(Reason.BAD_SHAPE, f"array has {ndim} dimensions")
    if pad >= ALIGNMENT:
        raise ProtocolError(Reason.MALFORMED, f"array header pad of {pad} bytes")
    dtype_at = start + HEADER_FIXED
    dims_at = dtype_at + dtype_len + pad
    data_at = dims_at + 8 * ndim
    if data_at > end:
        raise ProtocolError(Reason.MALFORMED, "array header truncated")
    try:
        dtype_str = bytes(buffer[dtype_at:dtype_at + dtype_len]).decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(Reason.BAD_DTYPE, "dtype is not ASCII") from None
    if dtype_str not in limits.allowed_dtypes:
        raise ProtocolError(Reason.BAD_DTYPE, f"dtype {dtype_str!r} is not allowed")
    dims = struct.unpack_from(f"<{ndim}Q", buffer, dims_at)
    if any(d > MAX_DIM for d in dims):
        raise ProtocolError(Reason.TOO_MANY_ELEMENTS, f"array dimension over {MAX_DIM}")
    count = math.prod(dims)
    # An empty array's other dimensions count too: numpy refuses a shape whose non-zero product overflows
    # (with a ValueError no receiver expects), and no real array is 0 x 2^62.
    extent = math.prod(d for d in dims if d)
    if count > limits.max_array_elements or count > budget.elements_left or extent > limits.max_array_elements:
        raise ProtocolError(Reason.TOO_MANY_ELEMENTS, f"array of shape {dims} is over the element limit")
    budget.elements_left -= count
    dtype = np.dtype(dtype_str)
    if end - data_at != count * dtype.itemsize:
        raise ProtocolError(
            Reason.MALFORMED,
            f"array {dtype_str}{list(dims)} declares {count * dtype.itemsize} bytes, carries {end - data_at}",
        )
    if count == 0:
        try:
            return np.empty(dims, dtype=dtype)
        except ValueError:  # numpy's own size check, on limits looser than any real array needs
            raise ProtocolError(Reason.TOO_MANY_ELEMENTS, f"empty array of shape {dims} is too large") from None
    array = np.frombuffer(buffer, dtype=dtype, count=count, offset=data_at).reshape(dims)
    array.flags.writeable = False  # a view of the caller's payload, which may be a bytearray
    return array
