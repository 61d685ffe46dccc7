"""Hand-made payloads shared by the malformed-input tests."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest

from protocol.codec import EXT_NDARRAY, encode
from protocol.errors import ProtocolError, Reason
from protocol.messages import Update
from protocol.wire import decode_message, encode_message

from .wire_strategies import assert_same_message, sample_update


def reason_of(call: Callable[[], Any]) -> Reason:
    """Run ``call``; it must raise ProtocolError (and nothing else). Return the reason."""
    with pytest.raises(ProtocolError) as info:
        call()
    return info.value.reason


def ext_array(dtype: bytes, dims: tuple[int, ...], data: bytes, ndim: int | None = None) -> msgpack.ExtType:
    """A hand-made array ext value; ``ndim`` may lie about ``len(dims)``."""
    head = bytes([len(dims) if ndim is None else ndim, len(dtype), 0]) + dtype
    head += b"".join(struct.pack("<Q", d) for d in dims)
    return msgpack.ExtType(EXT_NDARRAY, head + data)


def ext_with_code(code: int, data: bytes) -> bytes:
    """msgpack's framing of an ext value with any signed type code (ExtType allows 0..127 only)."""
    framed = bytearray(msgpack.packb(msgpack.ExtType(0, data)))
    framed[len(framed) - len(data) - 1] = code & 0xFF
    return bytes(framed)


def update_dict(**overrides: Any) -> dict[str, Any]:
    """A valid Update as plain data, with fields replaced: encode it with msgpack or our codec."""
    data = sample_update().model_dump(mode="python")
    data.update(overrides)
    return data


def packb_update(**overrides: Any) -> bytes:
    """msgpack's own packing (ExtType values allowed) of an update dict."""
    def convert(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            little = value.astype(value.dtype.newbyteorder("<")) if value.dtype.byteorder == ">" else value
            return ext_array(little.dtype.str.encode(), little.shape, np.ascontiguousarray(little).tobytes())
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        return value

    return msgpack.packb(convert(update_dict(**overrides)), use_bin_type=True)


VALID_UPDATE = encode_message(sample_update())


def check_helpers_build_valid_messages() -> None:
    # Guards every test below: they differ from a valid message only in what they break.
    assert_same_message(sample_update(), decode_message(VALID_UPDATE, expect=Update))
    assert_same_message(sample_update(), decode_message(packb_update(), expect=Update))
    assert_same_message(sample_update(), decode_message(encode(update_dict()), expect=Update))
