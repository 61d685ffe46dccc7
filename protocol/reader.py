"""A bounded msgpack reader that decodes arrays without copying them.

msgpack's C unpacker copies every ext value into a new bytes object before an ext hook can
see it, so a 40 MB update would be copied once on receipt. Our messages are small trees of
a few dozen values around large arrays, so walking them here costs microseconds, and each
array becomes a view into the received payload. Every length is checked against the
limits and the bytes actually left before anything is built.
"""

from __future__ import annotations

import struct
from codecs import utf_8_decode
from typing import Any

from protocol.errors import ProtocolError, Reason
from protocol.limits import DecodeLimits
from protocol.ndarray_ext import EXT_NDARRAY, ArrayBudget, read_array

MAX_DEPTH = 64
TIMESTAMP_EXT = -1

_U16, _U32, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_F32, _F64 = struct.Struct(">f"), struct.Struct(">d")
_FIXEXT_SIZES = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


class _Reader:
    def __init__(self, payload: bytes | bytearray | memoryview, limits: DecodeLimits) -> None:
        view = memoryview(payload)
        # bytes and bytearray are already flat unsigned bytes: cast (an object per message) only the others
        self.buffer = view if view.format == "B" and view.ndim == 1 and view.c_contiguous else view.cast("B")
        self.end = self.buffer.nbytes
        self.pos = 0
        self.limits = limits
        self.max_str_len = limits.max_str_len
        self.items_left = limits.max_items
        self._budget: ArrayBudget | None = None

    @property
    def budget(self) -> ArrayBudget:
        """Made at the first array: most messages (statuses, announcements) carry none."""
        if self._budget is None:
            self._budget = ArrayBudget(self.limits)
        return self._budget

    # -- primitives ---------------------------------------------------------------------
    def _take(self, size: int) -> int:
        """Start of the next ``size`` bytes; raises if the payload ends first."""
        start = self.pos
        if size > self.end - start:
            raise ProtocolError(Reason.MALFORMED, f"truncated: {size} bytes declared, {self.end - start} left")
        self.pos = start + size
        return start

    def _unpack(self, fmt: struct.Struct) -> Any:
        return fmt.unpack_from(self.buffer, self._take(fmt.size))[0]

    def _count(self, count: int, what: str, limit: int) -> int:
        # Every element takes at least one byte: a count beyond the bytes left is a lie.
        if count > limit:
            raise ProtocolError(Reason.MALFORMED, f"{what} of {count} is over the limit of {limit}")
        if count > self.end - self.pos:
            raise ProtocolError(Reason.MALFORMED, f"{what} of {count} in {self.end - self.pos} bytes left")
        return count

    def _items(self, count: int) -> None:
        """Spend ``count`` of the message's container items (``DecodeLimits.max_items``)."""
        self.items_left -= count
        if self.items_left < 0:
            raise ProtocolError(Reason.MALFORMED, f"more than {self.limits.max_items} array elements and map "
                                                  f"entries in one message")

    # -- values -------------------------------------------------------------------------
    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ProtocolError(Reason.MALFORMED, f"nesting deeper than {MAX_DEPTH}")
        pos = self.pos  # _take(1), inlined: this runs for every value of every message
        if pos >= self.end:
            raise ProtocolError(Reason.MALFORMED, "truncated: 1 bytes declared, 0 left")
        marker = self.buffer[pos]
        self.pos = pos + 1
        if marker < 0x80:
            return marker
        if marker >= 0xE0:
            return marker - 0x100
        if marker >= 0xA0:
            return self._str(marker & 0x1F) if marker < 0xC0 else self._typed(marker, depth)
        if marker < 0x90:
            return self._map(marker & 0x0F, depth)
        return self._array(marker & 0x0F, depth)

    def _typed(self, marker: int, depth: int) -> Any:
        if marker == 0xC0:
            return None
        if marker == 0xC2:
            return False
        if marker == 0xC3:
            return True
        if marker == 0xCB:
            return self._unpack(_F64)
        if marker == 0xCA:
            return self._unpack(_F32)
        if marker == 0xCC:
            return self._byte()
        if 0xCD <= marker <= 0xCF:
            return self._unpack((_U16, _U32, _U64)[marker - 0xCD])
        if 0xD0 <= marker <= 0xD3:
            return self._unpack((_I8, _I16, _I32, _I64)[marker - 0xD0])
        if 0xD9 <= marker <= 0xDB:
            return self._str(self._length(marker - 0xD9))
        if 0xC4 <= marker <= 0xC6:
            size = self._length(marker - 0xC4)
            self._count(size, "bin length", self.limits.max_payload_bytes)
            start = self._take(size)
            return bytes(self.buffer[start:start + size])
        if marker in (0xDC, 0xDD):
            return self._array(self._unpack(_U16 if marker == 0xDC else _U32), depth)
        if marker in (0xDE, 0xDF):
            return self._map(self._unpack(_U16 if marker == 0xDE else _U32), depth)
        if marker in _FIXEXT_SIZES:
            return self._ext(_FIXEXT_SIZES[marker])
        if 0xC7 <= marker <= 0xC9:
            return self._ext(self._length(marker - 0xC7))
        raise ProtocolError(Reason.MALFORMED, f"byte 0x{marker:02x} is not a msgpack type")

    def _byte(self) -> int:
        return self.buffer[self._take(1)]

    def _length(self, size_class: int) -> int:
        """A length field of 1, 2 or 4 bytes (size class 0, 1, 2)."""
        return self._byte() if size_class == 0 else self._unpack(_U16 if size_class == 1 else _U32)

    def _str(self, size: int) -> str:
        start = self.pos
        if size > self.max_str_len or size > self.end - start:  # _count's checks, its messages
            self._count(size, "string length", self.max_str_len)
        self.pos = start + size
        try:
            # utf_8_decode reads the view in place; str(view, "utf-8") is several times slower on small strings
            return utf_8_decode(self.buffer[start:start + size], "strict", True)[0]
        except UnicodeDecodeError:
            raise ProtocolError(Reason.MALFORMED, "string is not valid UTF-8") from None

    def _array(self, count: int, depth: int) -> list[Any]:
        self._count(count, "array length", self.limits.max_container_len)
        self._items(count)
        return [self.value(depth + 1) for _ in range(count)]

    def _map(self, count: int, depth: int) -> dict[str, Any]:
        self._count(count, "map length", self.limits.max_container_len)
        self._items(count)
        out: dict[str, Any] = {}
        inner = depth + 1
        if count and inner > MAX_DEPTH:  # what value() would say of the first key
            raise ProtocolError(Reason.MALFORMED, f"nesting deeper than {MAX_DEPTH}")
        buffer, value = self.buffer, self.value
        for _ in range(count):
            pos = self.pos
            marker = buffer[pos] if pos < self.end else 0
            if 0xA0 <= marker < 0xC0:  # a fixstr key, as nearly all are: read here, without value()'s dispatch
                self.pos = pos + 1
                key = self._str(marker & 0x1F)
            else:
                key = value(inner)
            if not isinstance(key, str):
                raise ProtocolError(Reason.MALFORMED, f"map key of type {type(key).__name__}, expected str")
            if key in out:  # readers differ on which copy wins: one signed message must mean one thing
                raise ProtocolError(Reason.MALFORMED, f"map key {key[:64]!r} repeats")
            pos = self.pos
            marker = buffer[pos] if pos < self.end else 0xC1  # 0xC1: none of the cases below; value() says why
            # The commonest values in place, as value() would read them (depth is checked above):
            if marker < 0x80:  # positive fixint
                self.pos = pos + 1
                out[key] = marker
            elif 0xA0 <= marker < 0xC0:  # fixstr
                self.pos = pos + 1
                out[key] = self._str(marker & 0x1F)
            elif marker == 0xC0:
                self.pos = pos + 1
                out[key] = None
            else:
                out[key] = value(inner)
        return out

    def _ext(self, size: int) -> Any:
        code = self._unpack(_I8)
        self._count(size, "ext length", self.limits.max_payload_bytes)
        start = self._take(size)
        if code == EXT_NDARRAY:
            return read_array(self.buffer, start, size, self.budget)
        if code == TIMESTAMP_EXT:
            raise ProtocolError(Reason.UNKNOWN_EXTENSION, "unknown msgpack extension type -1 (timestamp)")
        raise ProtocolError(Reason.UNKNOWN_EXTENSION, f"unknown msgpack extension type {code}")


def read_message(payload: bytes | bytearray | memoryview, limits: DecodeLimits) -> Any:
    """One msgpack value filling the whole payload. Raises only :class:`ProtocolError`."""
    try:
        reader = _Reader(payload, limits)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(Reason.MALFORMED, f"not a byte buffer: {exc}") from None
    if reader.end > limits.max_payload_bytes:
        raise ProtocolError(Reason.TOO_LARGE, f"payload of {reader.end} bytes is over {limits.max_payload_bytes}")
    if reader.end == 0:
        raise ProtocolError(Reason.MALFORMED, "empty payload")
    value = reader.value(0)
    if reader.pos != reader.end:
        raise ProtocolError(Reason.MALFORMED, f"{reader.end - reader.pos} bytes of extra data after the message")
    return value
