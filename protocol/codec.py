"""msgpack codec with numpy arrays as an extension type.

Arrays travel in the layout of :mod:`protocol.ndarray_ext`, aligned so that a decoded array
is a read-only view straight into the received payload: decoding copies no array data at
all (see :mod:`protocol.reader`). Encoding joins the parts once: one copy of each array.
Everything else is plain msgpack. Never pickle.

Every decode is bounded by :class:`~protocol.limits.DecodeLimits`, checked before anything
is built, and anything malformed raises :class:`~protocol.errors.ProtocolError`.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from protocol.limits import DEFAULT_LIMITS, DecodeLimits
from protocol.ndarray_ext import EXT_NDARRAY, array_parts
from protocol.reader import read_message

__all__ = ["EXT_NDARRAY", "decode", "encode"]


_COPY_BELOW = 64 * 1024
"""Blobs smaller than this are packed by msgpack itself (one copy either way)."""


class _Encoder:
    """Collects the message's parts, tracking the offset so array data lands aligned."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0
        self.packer = msgpack.Packer(autoreset=True, use_bin_type=True)

    def add(self, part: bytes | memoryview) -> None:
        self.parts.append(part)
        self.size += memoryview(part).nbytes

    def value(self, obj: Any) -> None:
        if isinstance(obj, np.ndarray):
            for part in array_parts(obj, self.size):
                self.add(part)
        elif isinstance(obj, dict):
            self.add(self.packer.pack_map_header(len(obj)))
            for key, item in obj.items():
                if not isinstance(key, str):
                    raise TypeError(f"map keys must be str, got {type(key).__name__}")
                self.add(self.packer.pack(key))
                self.value(item)
        elif isinstance(obj, (list, tuple)):
            self.add(self.packer.pack_array_header(len(obj)))
            for item in obj:
                self.value(item)
        elif isinstance(obj, (bytes, bytearray, memoryview)) and len(obj) > _COPY_BELOW:
            # A large blob (a signed envelope's payload): header here, data joined once at the end,
            # instead of being copied into msgpack's growing buffer first.
            size = memoryview(obj).nbytes
            self.add(bytes([0xC4, size]) if size < 2**8 else
                     b"\xc5" + size.to_bytes(2, "big") if size < 2**16 else b"\xc6" + size.to_bytes(4, "big"))
            self.add(obj)
        elif isinstance(obj, np.generic):
            self.add(self.packer.pack(obj.item()))
        else:
            self.add(self.packer.pack(obj))


def encode(obj: Any) -> bytes:
    """Encode plain data (dicts, lists, scalars, bytes, numpy arrays) to msgpack bytes."""
    encoder = _Encoder()
    encoder.value(obj)
    return b"".join(encoder.parts)


def decode(payload: bytes | bytearray | memoryview, limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """Decode msgpack bytes from an untrusted source. Raises only :class:`ProtocolError`.

    Arrays in the result are read-only views of ``payload`` (which they keep alive).
    """
    return read_message(payload, limits)
