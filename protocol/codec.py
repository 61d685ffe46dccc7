"""msgpack codec with numpy arrays as an extension type.

Wire layout of one array (msgpack ext type ``EXT_NDARRAY``)::

    u8 ndim | u8 len(dtype) | dtype (ASCII, e.g. "<f4") | zero pad to 8 bytes
    | ndim x u64 little-endian dims | raw little-endian C-order data

The header is padded so the data starts 8-byte aligned inside the ext payload. Encoding
joins the parts once (one copy of each array); decoding returns read-only arrays that view
the ext payload through ``np.frombuffer`` (no second copy). Never pickle.

Every decode is bounded by :class:`~protocol.limits.DecodeLimits`, checked before arrays
are materialised, and anything malformed raises :class:`~protocol.errors.ProtocolError`.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np

from protocol.errors import ProtocolError, Reason
from protocol.limits import DEFAULT_LIMITS, DecodeLimits

EXT_NDARRAY = 1

_FIXEXT_MARKERS = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
_HEAD = struct.Struct("<BB")


def _align8(n: int) -> int:
    return (n + 7) & ~7


def _ext_prefix(length: int) -> bytes:
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


def _array_parts(array: np.ndarray) -> list[bytes | memoryview]:
    if array.dtype.hasobject or array.dtype.fields is not None:
        raise TypeError(f"cannot encode arrays of dtype {array.dtype}")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
    dtype = array.dtype.str.encode("ascii")
    head = _HEAD.pack(array.ndim, len(dtype)) + dtype
    head += b"\0" * (_align8(len(head)) - len(head))
    head += struct.pack(f"<{array.ndim}Q", *array.shape)
    data = memoryview(array).cast("B") if array.size else b""
    return [_ext_prefix(len(head) + array.nbytes), head, data]


def _emit(obj: Any, packer: msgpack.Packer, parts: list[bytes | memoryview]) -> None:
    if isinstance(obj, np.ndarray):
        parts.extend(_array_parts(obj))
    elif isinstance(obj, dict):
        parts.append(packer.pack_map_header(len(obj)))
        for key, value in obj.items():
            if not isinstance(key, str):
                raise TypeError(f"map keys must be str, got {type(key).__name__}")
            parts.append(packer.pack(key))
            _emit(value, packer, parts)
    elif isinstance(obj, (list, tuple)):
        parts.append(packer.pack_array_header(len(obj)))
        for value in obj:
            _emit(value, packer, parts)
    elif isinstance(obj, np.generic):
        parts.append(packer.pack(obj.item()))
    else:
        parts.append(packer.pack(obj))


def encode(obj: Any) -> bytes:
    """Encode plain data (dicts, lists, scalars, bytes, numpy arrays) to msgpack bytes."""
    parts: list[bytes | memoryview] = []
    _emit(obj, msgpack.Packer(autoreset=True, use_bin_type=True), parts)
    return b"".join(parts)


class _ArrayDecoder:
    """ext_hook for one decode: checks every declared size before building a view."""

    def __init__(self, limits: DecodeLimits) -> None:
        self.limits = limits
        self.elements_left = limits.max_total_elements

    def __call__(self, code: int, data: bytes) -> np.ndarray:
        if code != EXT_NDARRAY:
            raise ProtocolError(Reason.UNKNOWN_EXTENSION, f"unknown msgpack extension type {code}")
        if len(data) < _HEAD.size:
            raise ProtocolError(Reason.MALFORMED, "array header truncated")
        ndim, dtype_len = _HEAD.unpack_from(data)
        if ndim > self.limits.max_ndim:
            raise ProtocolError(Reason.BAD_SHAPE, f"array has {ndim} dimensions")
        dims_at = _align8(_HEAD.size + dtype_len)
        data_at = dims_at + 8 * ndim
        if len(data) < data_at:
            raise ProtocolError(Reason.MALFORMED, "array header truncated")
        try:
            dtype_str = data[_HEAD.size:_HEAD.size + dtype_len].decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError(Reason.BAD_DTYPE, "dtype is not ASCII") from None
        if dtype_str not in self.limits.allowed_dtypes:
            raise ProtocolError(Reason.BAD_DTYPE, f"dtype {dtype_str!r} is not allowed")
        dims = struct.unpack_from(f"<{ndim}Q", data, dims_at)
        count = math.prod(dims)
        if count > self.limits.max_array_elements or count > self.elements_left:
            raise ProtocolError(Reason.TOO_MANY_ELEMENTS, f"array of shape {dims} is over the element limit")
        self.elements_left -= count
        dtype = np.dtype(dtype_str)
        if len(data) - data_at != count * dtype.itemsize:
            raise ProtocolError(
                Reason.MALFORMED,
                f"array {dtype_str}{list(dims)} declares {count * dtype.itemsize} bytes, carries {len(data) - data_at}",
            )
        if count == 0:
            return np.empty(dims, dtype=dtype)
        return np.frombuffer(data, dtype=dtype, count=count, offset=data_at).reshape(dims)


def decode(payload: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """Decode msgpack bytes from an untrusted source. Raises only :class:`ProtocolError`."""
    size = memoryview(payload).nbytes
    if size > limits.max_payload_bytes:
        raise ProtocolError(Reason.TOO_LARGE, f"payload of {size} bytes is over {limits.max_payload_bytes}")
    if size == 0:
        raise ProtocolError(Reason.MALFORMED, "empty payload")
    try:
        obj = msgpack.unpackb(
            payload,
            ext_hook=_ArrayDecoder(limits),
            raw=False,
            strict_map_key=True,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_payload_bytes,
            max_array_len=limits.max_container_len,
            max_map_len=limits.max_container_len,
            max_ext_len=limits.max_payload_bytes,
        )
    except ProtocolError:
        raise
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        # ValueError covers msgpack's ExtraData, FormatError, StackError and truncation,
        # and UnicodeDecodeError for invalid UTF-8 strings.
        raise ProtocolError(Reason.MALFORMED, f"{type(exc).__name__}: {exc}"[:200]) from None
    _reject_timestamps(obj)
    return obj


def _reject_timestamps(obj: Any) -> None:
    """msgpack decodes extension type -1 (its timestamp) itself, never calling ``ext_hook``."""
    pending = [obj]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, msgpack.Timestamp):
            raise ProtocolError(Reason.UNKNOWN_EXTENSION, "unknown msgpack extension type -1 (timestamp)")
