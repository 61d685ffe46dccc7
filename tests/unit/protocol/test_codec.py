"""Round trips through the msgpack codec, its ext framing, and zero-copy decoding."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import EXT_NDARRAY, decode, encode
from protocol.errors import ProtocolError, Reason
from protocol.ndarray_ext import ext_prefix as _ext_prefix

from .wire_strategies import (
    ALLOWED_DTYPES,
    any_layout_arrays,
    arrays,
    assert_wire_equal,
    plain_data,
    plain_scalars,
    wire_dtype,
)

FAST = settings(deadline=None, max_examples=60)


def expected_ext_payload(array: np.ndarray, pad: int) -> bytes:
    """The documented layout, built independently of the codec:
    u8 ndim | u8 len(dtype) | u8 pad | dtype | pad zeros | ndim x u64 dims | little-endian C-order data."""
    little = array.astype(wire_dtype(array.dtype))
    dtype = little.dtype.str.encode("ascii")
    head = bytes([array.ndim, len(dtype), pad]) + dtype + b"\0" * pad
    head += b"".join(struct.pack("<Q", d) for d in array.shape)
    return head + little.tobytes(order="C")


def expected_message(array: np.ndarray) -> bytes:
    """msgpack's own framing of the documented layout for ``array`` alone, with the pad that puts
    its data at a multiple of 16 bytes from the start of the message."""
    for pad in range(16):
        framed = msgpack.packb(msgpack.ExtType(EXT_NDARRAY, expected_ext_payload(array, pad)))
        if (len(framed) - array.nbytes) % 16 == 0:
            return framed
    # No pad aligns with the shortest framing: ext 32 (valid msgpack for any length) instead.
    for pad in range(16):
        body = expected_ext_payload(array, pad)
        framed = b"\xc9" + struct.pack(">I", len(body)) + bytes([EXT_NDARRAY]) + body
        if (len(framed) - array.nbytes) % 16 == 0:
            return framed
    raise AssertionError("no pad aligns the data")


def parse_documented(code: int, data: bytes) -> np.ndarray:
    """An independent reader of the documented layout, as msgpack's ext hook."""
    assert code == EXT_NDARRAY
    ndim, dtype_len, pad = data[0], data[1], data[2]
    dtype = data[3:3 + dtype_len].decode("ascii")
    dims_at = 3 + dtype_len + pad
    dims = struct.unpack_from(f"<{ndim}Q", data, dims_at)
    return np.frombuffer(data, dtype=dtype, offset=dims_at + 8 * ndim).reshape(dims)


def data_offsets(payload: bytes) -> list[int]:
    """Where each decoded array's data starts in ``payload``."""
    offsets: list[int] = []

    def walk(value: Any) -> None:
        if isinstance(value, np.ndarray):
            if value.size:
                offsets.append(value.ctypes.data - np.frombuffer(payload, dtype=np.uint8).ctypes.data)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(decode(payload))
    return offsets


def root_buffer(array: np.ndarray) -> Any:
    base: Any = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


# ---------------------------------------------------------------------------- round trips


@FAST
@given(plain_data())
def test_plain_data_round_trips(value: Any) -> None:
    assert_wire_equal(value, decode(encode(value)))


@FAST
@given(any_layout_arrays())
def test_any_array_round_trips(array: np.ndarray) -> None:
    decoded = decode(encode(array))
    assert_wire_equal(array, decoded)


@FAST
@given(plain_data(plain_scalars | any_layout_arrays()))
def test_nested_data_with_arrays_round_trips(value: Any) -> None:
    assert_wire_equal(value, decode(encode(value)))


@pytest.mark.parametrize("dtype", ALLOWED_DTYPES)
@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_every_allowed_dtype_round_trips_in_both_byte_orders(dtype: str, byteorder: str) -> None:
    source = np.dtype(dtype)
    if source.itemsize > 1:
        source = source.newbyteorder(byteorder)
    array = (np.arange(24) % 7).astype(source).reshape(2, 3, 4)
    decoded = decode(encode(array))
    assert decoded.dtype.str == dtype  # always the little-endian (or byte-order free) wire dtype
    assert decoded.shape == (2, 3, 4)
    assert np.array_equal(decoded, array)


@pytest.mark.parametrize("dtype", ALLOWED_DTYPES)
def test_zero_dimensional_arrays_stay_zero_dimensional(dtype: str) -> None:
    array = np.array(1, dtype=dtype)
    decoded = decode(encode(array))
    assert isinstance(decoded, np.ndarray)
    assert decoded.shape == ()
    assert decoded.dtype.str == dtype
    assert decoded == array


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 5), (0, 0, 0, 0)])
def test_empty_arrays_keep_their_shape(shape: tuple[int, ...]) -> None:
    array = np.zeros(shape, dtype="<f4")
    decoded = decode(encode(array))
    assert decoded.shape == shape
    assert decoded.dtype.str == "<f4"


def test_numpy_scalars_decode_as_python_scalars() -> None:
    value = {"f": np.float32(1.5), "i": np.int64(-3), "b": np.bool_(True)}
    assert decode(encode(value)) == {"f": 1.5, "i": -3, "b": True}
    assert type(decode(encode(np.bool_(False)))) is bool


@pytest.mark.parametrize("value", [{1: "int key"}, {b"k": 1}, {None: 1}])
def test_non_string_map_keys_are_refused_on_encode(value: dict[Any, Any]) -> None:
    with pytest.raises(TypeError):
        encode(value)


@pytest.mark.parametrize("dtype", [object, "<U4", "<c8", [("a", "<f4"), ("b", "<i4")]])
def test_unencodable_dtypes_are_refused_or_rejected(dtype: Any) -> None:
    array = np.zeros(2, dtype=dtype)
    try:
        payload = encode(array)
    except TypeError:
        return
    # The sender may build it; no receiver with the default limits accepts it.
    with pytest.raises(ProtocolError) as info:
        decode(payload)
    assert info.value.reason is Reason.BAD_DTYPE


# ---------------------------------------------------------------------------- framing

FRAMING_LENGTHS = [1, 2, 3, 4, 5, 8, 15, 16, 17, 100, 255, 256, 257, 1000, 65535, 65536, 65537, 200_000]


@pytest.mark.parametrize("length", FRAMING_LENGTHS)
def test_ext_prefix_matches_msgpack_framing(length: int) -> None:
    data = bytes(range(256)) * (length // 256) + bytes(range(length % 256))
    assert len(data) == length
    assert _ext_prefix(length) + data == msgpack.packb(msgpack.ExtType(EXT_NDARRAY, data))


@FAST
@given(st.integers(min_value=1, max_value=2**32 - 1))
def test_ext_prefix_matches_msgpack_header_for_any_length(length: int) -> None:
    # msgpack.packb would need the data itself; compare against its framing of a stand-in
    # with the same length class, then check the declared length field.
    prefix = _ext_prefix(length)
    if length in (1, 2, 4, 8, 16):
        assert prefix == msgpack.packb(msgpack.ExtType(EXT_NDARRAY, b"\0" * length))[:2]
    elif length < 1 << 8:
        assert prefix == bytes([0xC7, length, EXT_NDARRAY])
    elif length < 1 << 16:
        assert prefix == b"\xc8" + struct.pack(">H", length) + bytes([EXT_NDARRAY])
    else:
        assert prefix == b"\xc9" + struct.pack(">I", length) + bytes([EXT_NDARRAY])


def test_ext_prefix_refuses_four_gibibytes() -> None:
    with pytest.raises(ValueError):
        _ext_prefix(1 << 32)


@pytest.mark.parametrize(
    ("array", "marker"),
    [
        # header: 3 fixed + 3 dtype + 8 per dim, then the pad that puts the data at a multiple
        # of 16 from the message start; the pad can push the length into the next size class.
        (np.zeros(0, dtype="<f4"), 0xC7),  # 3-byte prefix + 14 + pad 15 = 32: ext 8
        (np.array(7, dtype="|u1"), 0xC7),  # 3 + 6 + pad 7, then 1 byte: ext 8
        (np.zeros(50, dtype="<f4"), 0xC7),  # 14 + 15 + 200 = 229: ext 8
        (np.zeros(59, dtype="<f4"), 0xC8),  # 14 + 15 + 236 = 265 > 255: ext 16 (pad 14)
        (np.zeros(10000, dtype="<f4"), 0xC8),
        (np.zeros(16379, dtype="<f4"), 0xC9),  # 14 + 14 + 65516 > 65535: ext 32 (pad 12)
        (np.zeros((300, 300), dtype="<f8"), 0xC9),
    ],
)
def test_encoded_array_equals_msgpack_framing_of_documented_layout(array: np.ndarray, marker: int) -> None:
    encoded = encode(array)
    assert encoded == expected_message(array)
    assert encoded[0] == marker


@FAST
@given(any_layout_arrays())
def test_encoded_arrays_equal_msgpack_framing(array: np.ndarray) -> None:
    assert encode(array) == expected_message(array)


@FAST
@given(st.dictionaries(st.text(max_size=8), any_layout_arrays() | plain_scalars, max_size=4))
def test_containers_are_plain_msgpack_with_documented_arrays(value: dict[str, Any]) -> None:
    decoded = msgpack.unpackb(encode(value), ext_hook=parse_documented)
    assert_wire_equal(value, decoded)


@FAST
@given(st.lists(any_layout_arrays() | plain_scalars, max_size=6))
def test_array_data_starts_sixteen_byte_aligned_in_the_message(values: list[Any]) -> None:
    payload = encode({"values": values, "tail": np.arange(3, dtype="<f8")})
    assert all(offset % 16 == 0 for offset in data_offsets(payload))


# ---------------------------------------------------------------------------- zero copy


@FAST
@given(arrays().filter(lambda a: a.size > 0))
def test_decoded_arrays_are_read_only_views_of_the_payload(array: np.ndarray) -> None:
    decoded = decode(encode(array))
    assert decoded.base is not None
    assert not decoded.flags.writeable
    assert isinstance(root_buffer(decoded), bytes), "decoded array must view the payload, not own a copy"
    with pytest.raises(ValueError):
        decoded.flat[0] = decoded.flat[0]


def test_arrays_in_one_message_view_the_payload_itself() -> None:
    first = np.arange(1000, dtype="<f4")
    second = np.arange(500, dtype="<i8")
    payload = encode({"a": first, "b": second})
    decoded = decode(payload)
    assert root_buffer(decoded["a"]) is payload and root_buffer(decoded["b"]) is payload
    assert not decoded["a"].flags.writeable and decoded["a"].flags.aligned
    np.testing.assert_array_equal(decoded["a"], first)
    np.testing.assert_array_equal(decoded["b"], second)


def test_a_bytearray_payload_still_gives_read_only_arrays() -> None:
    payload = bytearray(encode(np.arange(8, dtype="<f4")))
    decoded = decode(payload)
    assert not decoded.flags.writeable
    with pytest.raises(ValueError):
        decoded[0] = 1.0
