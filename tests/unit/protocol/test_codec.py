"""Round trips through the msgpack codec, its ext framing, and zero-copy decoding."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import EXT_NDARRAY, _ext_prefix, decode, encode
from protocol.errors import ProtocolError, Reason

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


def expected_ext_payload(array: np.ndarray) -> bytes:
    """The documented layout, built independently of the codec:
    u8 ndim | u8 len(dtype) | dtype | zero pad to 8 | ndim x u64 dims | little-endian C-order data."""
    little = array.astype(wire_dtype(array.dtype))
    dtype = little.dtype.str.encode("ascii")
    head = bytes([array.ndim, len(dtype)]) + dtype
    head += b"\0" * (-len(head) % 8)
    head += b"".join(struct.pack("<Q", d) for d in array.shape)
    return head + little.tobytes(order="C")


def root_buffer(array: np.ndarray) -> Any:
    base: Any = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


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
        # The header alone is 8 bytes (0-d) or 16+ bytes, and a 0-d array holds one element,
        # so fixext 1/2/4/8 never frame an array; test_ext_prefix_matches_msgpack_framing covers them.
        (np.zeros(0, dtype="<f4"), 0xD8),  # 16-byte header, no data: fixext 16
        (np.array(7, dtype="|u1"), 0xC7),  # 8-byte header + 1 byte: ext 8
        (np.zeros(59, dtype="<f4"), 0xC7),  # 16 + 236 = 252: ext 8
        (np.zeros(60, dtype="<f4"), 0xC8),  # 16 + 240 = 256: ext 16
        (np.zeros(16379, dtype="<f4"), 0xC8),  # 16 + 65516 = 65532: ext 16
        (np.zeros(16380, dtype="<f4"), 0xC9),  # 16 + 65520 = 65536: ext 32
        (np.zeros((300, 300), dtype="<f8"), 0xC9),
    ],
)
def test_encoded_array_equals_msgpack_framing_of_documented_layout(array: np.ndarray, marker: int) -> None:
    payload = expected_ext_payload(array)
    encoded = encode(array)
    assert encoded == msgpack.packb(msgpack.ExtType(EXT_NDARRAY, payload))
    assert encoded[0] == marker


@FAST
@given(any_layout_arrays())
def test_encoded_arrays_equal_msgpack_framing(array: np.ndarray) -> None:
    assert encode(array) == msgpack.packb(msgpack.ExtType(EXT_NDARRAY, expected_ext_payload(array)))


@FAST
@given(st.dictionaries(st.text(max_size=8), any_layout_arrays() | plain_scalars, max_size=4))
def test_containers_are_framed_like_msgpack(value: dict[str, Any]) -> None:
    def as_ext(v: Any) -> Any:
        return msgpack.ExtType(EXT_NDARRAY, expected_ext_payload(v)) if isinstance(v, np.ndarray) else v

    assert encode(value) == msgpack.packb({k: as_ext(v) for k, v in value.items()}, use_bin_type=True)


@pytest.mark.parametrize("dtype", ALLOWED_DTYPES)
@pytest.mark.parametrize("ndim", [0, 1, 3, 8])
def test_array_data_starts_eight_byte_aligned_in_the_ext_payload(dtype: str, ndim: int) -> None:
    array = np.zeros((1,) * ndim, dtype=dtype)
    ext_data = msgpack.unpackb(encode(array), ext_hook=lambda code, data: data)
    header = len(ext_data) - array.nbytes
    assert header % 8 == 0
    assert header == 8 + 8 * ndim


# ---------------------------------------------------------------------------- zero copy


@FAST
@given(arrays().filter(lambda a: a.size > 0))
def test_decoded_arrays_are_read_only_views_of_the_payload(array: np.ndarray) -> None:
    decoded = decode(encode(array))
    assert decoded.base is not None
    assert not decoded.flags.writeable
    assert isinstance(root_buffer(decoded), bytes), "decoded array must view the ext bytes, not own a copy"
    with pytest.raises(ValueError):
        decoded.flat[0] = decoded.flat[0]


def test_arrays_in_one_message_view_their_own_ext_payloads() -> None:
    first = np.arange(1000, dtype="<f4")
    second = np.arange(500, dtype="<i8")
    decoded = decode(encode({"a": first, "b": second}))
    a_root, b_root = root_buffer(decoded["a"]), root_buffer(decoded["b"])
    assert isinstance(a_root, bytes) and isinstance(b_root, bytes)
    assert len(a_root) == len(expected_ext_payload(first))
    assert len(b_root) == len(expected_ext_payload(second))
