"""Anything malformed raises ProtocolError with the right Reason, and never anything else."""

from __future__ import annotations

import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codec import EXT_NDARRAY, decode, encode
from protocol.errors import ProtocolError, Reason
from protocol.limits import DecodeLimits
from protocol.messages import Update
from protocol.wire import decode_message

from .malformed_cases import (
    VALID_UPDATE,
    check_helpers_build_valid_messages,
    ext_array,
    ext_with_code,
    packb_update,
    reason_of,
)
from .wire_strategies import assert_same_message, sample_update

FUZZ = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])


def test_the_helpers_build_valid_messages() -> None:
    # Guards every test below: they differ from a valid message only in what they break.
    check_helpers_build_valid_messages()


# ---------------------------------------------------------------------------- bytes


def test_every_prefix_of_a_valid_update_is_malformed() -> None:
    for end in range(len(VALID_UPDATE)):
        assert reason_of(lambda: decode_message(VALID_UPDATE[:end])) is Reason.MALFORMED, end  # noqa: B023 (called at once)


def test_trailing_bytes_are_malformed() -> None:
    assert reason_of(lambda: decode_message(VALID_UPDATE + b"\xc0")) is Reason.MALFORMED


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_message(data)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_raise_protocol_error(data: bytes) -> None:
    try:
        decode(data)
    except ProtocolError:
        pass


@FUZZ
@given(st.data())
def test_corrupted_updates_decode_to_a_valid_update_or_raise_protocol_error(data: st.DataObject) -> None:
    corrupted = bytearray(VALID_UPDATE)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(corrupted) - 1))
        corrupted[at] = data.draw(st.integers(0, 255))
    try:
        message = decode_message(bytes(corrupted), expect=Update)
    except ProtocolError:
        return
    assert isinstance(message, Update)
    for array in message.delta.values():
        assert array.dtype.kind not in "fc" or np.isfinite(array).all()


@pytest.mark.parametrize("payload", [b"", bytearray(), memoryview(b"")])
def test_empty_payload_is_malformed(payload: bytes) -> None:
    assert reason_of(lambda: decode_message(payload)) is Reason.MALFORMED


def test_invalid_utf8_string_is_malformed() -> None:
    assert reason_of(lambda: decode(b"\xa2\xff\xfe")) is Reason.MALFORMED


def test_deep_nesting_is_malformed() -> None:
    assert reason_of(lambda: decode(b"\x91" * 100_000 + b"\xc0")) is Reason.MALFORMED


@pytest.mark.parametrize("key", [1, 1.5, None, True, [1]])
def test_non_string_map_keys_are_malformed(key: Any) -> None:
    # msgpack cannot pack a list key; frame {key: 1} by hand: fixmap(1), key, 1
    payload = b"\x81" + msgpack.packb(key) + b"\x01"
    assert reason_of(lambda: decode(payload)) is Reason.MALFORMED


# ---------------------------------------------------------------------------- limits


def test_payload_over_max_payload_bytes_is_too_large() -> None:
    limits = DecodeLimits(max_payload_bytes=len(VALID_UPDATE) - 1)
    assert reason_of(lambda: decode_message(VALID_UPDATE, limits=limits)) is Reason.TOO_LARGE
    exact = DecodeLimits(max_payload_bytes=len(VALID_UPDATE))
    assert_same_message(sample_update(), decode_message(VALID_UPDATE, limits=exact))


@pytest.mark.parametrize("container", ["list", "map"])
def test_containers_over_the_length_limit_are_malformed(container: str) -> None:
    limits = DecodeLimits(max_container_len=10)
    make = (lambda n: list(range(n))) if container == "list" else (lambda n: {str(i): i for i in range(n)})
    assert decode(encode(make(10)), limits) == make(10)
    assert reason_of(lambda: decode(encode(make(11)), limits)) is Reason.MALFORMED
    assert reason_of(lambda: decode(encode({"nested": [make(11)]}), limits)) is Reason.MALFORMED


def test_container_length_is_checked_from_the_header_alone() -> None:
    # array32 declaring 2**32 - 1 elements, followed by nothing: rejected before allocating.
    assert reason_of(lambda: decode(b"\xdd\xff\xff\xff\xff")) is Reason.MALFORMED
    assert reason_of(lambda: decode(b"\xdf\xff\xff\xff\xff")) is Reason.MALFORMED


def test_strings_over_the_length_limit_are_malformed() -> None:
    limits = DecodeLimits(max_str_len=8)
    assert decode(encode("x" * 8), limits) == "x" * 8
    assert reason_of(lambda: decode(encode("x" * 9), limits)) is Reason.MALFORMED


def test_array_over_the_element_limit_is_rejected_before_allocation() -> None:
    # A header declaring 10**12 float64 elements (8 TB) carrying 8 bytes of data.
    huge = msgpack.packb(ext_array(b"<f8", (10**6, 10**6), b"\0" * 8))
    assert reason_of(lambda: decode(huge)) is Reason.TOO_MANY_ELEMENTS
    # With limits that allow it, the size check fails next: still nothing was allocated
    # (numpy reports its allocations to tracemalloc).
    lax = DecodeLimits(max_array_elements=2**62, max_total_elements=2**62)
    tracemalloc.start()
    try:
        for limits in (DecodeLimits(), lax):
            with pytest.raises(ProtocolError):
                decode(huge, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert reason_of(lambda: decode(huge, lax)) is Reason.MALFORMED


@pytest.mark.parametrize("dims", [(2**64 - 1,), (2**32, 2**32), (2**63, 2**63, 0, 5), (0, 2**62), (0, 2**40, 2**40)])
def test_absurd_dimensions_never_escape_as_other_errors(dims: tuple[int, ...]) -> None:
    payload = msgpack.packb(ext_array(b"<f4", dims, b""))
    lax = DecodeLimits(max_array_elements=2**62, max_total_elements=2**62)
    for limits in (DecodeLimits(), lax):
        assert reason_of(lambda: decode(payload, limits)) in (Reason.TOO_MANY_ELEMENTS, Reason.MALFORMED)  # noqa: B023


def test_total_elements_over_the_limit_across_arrays() -> None:
    limits = DecodeLimits(max_array_elements=100, max_total_elements=150)
    one = np.zeros(100, dtype="<f4")
    assert decode(encode({"a": one}), limits)["a"].shape == (100,)
    assert reason_of(lambda: decode(encode({"a": one, "b": one}), limits)) is Reason.TOO_MANY_ELEMENTS
    assert reason_of(lambda: decode(encode(np.zeros(101, dtype="<f4")), limits)) is Reason.TOO_MANY_ELEMENTS


def test_too_many_dimensions_is_bad_shape() -> None:
    limits = DecodeLimits(max_ndim=3)
    assert decode(encode(np.zeros((1, 1, 1))), limits).shape == (1, 1, 1)
    assert reason_of(lambda: decode(encode(np.zeros((1, 1, 1, 1))), limits)) is Reason.BAD_SHAPE
    assert reason_of(lambda: decode(msgpack.packb(ext_array(b"<f4", (1,) * 255, b"\0" * 4)))) is Reason.BAD_SHAPE


# ---------------------------------------------------------------------------- array headers


@pytest.mark.parametrize(
    "ext",
    [
        pytest.param(msgpack.ExtType(EXT_NDARRAY, b""), id="empty"),
        pytest.param(msgpack.ExtType(EXT_NDARRAY, b"\x01"), id="one-byte"),
        pytest.param(msgpack.ExtType(EXT_NDARRAY, b"\x01\x03<f4\0\0\0"), id="dims-missing"),
        pytest.param(msgpack.ExtType(EXT_NDARRAY, b"\x02\x03<f4\0\0\0" + b"\x01" + b"\0" * 7), id="dims-short"),
        pytest.param(msgpack.ExtType(EXT_NDARRAY, b"\x00\x40<f4"), id="dtype-length-past-end"),
        pytest.param(ext_array(b"<f4", (3,), b"\0" * 11), id="data-short"),
        pytest.param(ext_array(b"<f4", (3,), b"\0" * 13), id="data-long"),
        pytest.param(ext_array(b"<f4", (0,), b"\0" * 4), id="data-for-empty"),
        pytest.param(ext_array(b"<f4", (), b""), id="0d-without-data"),
        pytest.param(ext_array(b"<f4", (2, 2), b"\0" * 16, ndim=1), id="ndim-understates-dims"),
    ],
)
def test_header_and_data_length_mismatch_is_malformed(ext: msgpack.ExtType) -> None:
    assert reason_of(lambda: decode(msgpack.packb(ext))) is Reason.MALFORMED
    assert reason_of(lambda: decode_message(packb_update(delta={"w": ext}))) is Reason.MALFORMED


@pytest.mark.parametrize(
    "dtype",
    [b"|O", b"|O8", b"<U4", b">f4", b">i8", b"<c8", b"<c16", b"<M8[s]", b"<m8[ns]", b"|V8", b"|S4", b"f4", b"float32",
     b"", b"\xff\xfe", b"<f4 ", b"<f16"],
)
def test_disallowed_dtypes_are_bad_dtype(dtype: bytes) -> None:
    ext = ext_array(dtype, (1,), b"\0" * 16)
    assert reason_of(lambda: decode(msgpack.packb(ext))) is Reason.BAD_DTYPE
    assert reason_of(lambda: decode_message(packb_update(delta={"w": ext}))) is Reason.BAD_DTYPE


def test_a_narrowed_allowed_dtype_set_is_enforced() -> None:
    limits = DecodeLimits(allowed_dtypes=frozenset({"<f4"}))
    assert decode(encode(np.zeros(2, dtype="<f4")), limits).dtype.str == "<f4"
    assert reason_of(lambda: decode(encode(np.zeros(2, dtype="<f8")), limits)) is Reason.BAD_DTYPE


@pytest.mark.parametrize("code", [0, 2, 5, 127, -2, -100, -128])
def test_unknown_extension_codes(code: int) -> None:
    raw = ext_with_code(code, b"\0" * 16)
    assert reason_of(lambda: decode(raw)) is Reason.UNKNOWN_EXTENSION
    assert reason_of(lambda: decode(b"\x91" + raw)) is Reason.UNKNOWN_EXTENSION


@given(st.integers(-128, 127).filter(lambda c: c not in (EXT_NDARRAY, -1)), st.binary(max_size=40))
@settings(deadline=None, max_examples=50)
def test_any_unknown_extension_code_is_rejected(code: int, data: bytes) -> None:
    assert reason_of(lambda: decode(ext_with_code(code, data))) is Reason.UNKNOWN_EXTENSION


@pytest.mark.parametrize("length", [4, 8, 12])
def test_msgpack_timestamps_are_an_unknown_extension(length: int) -> None:
    # Type -1 is msgpack's timestamp, which msgpack decodes itself without calling ext_hook.
    raw = ext_with_code(-1, b"\0" * length)
    assert reason_of(lambda: decode(raw)) is Reason.UNKNOWN_EXTENSION
    assert reason_of(lambda: decode(b"\x81\xa1t" + raw)) is Reason.UNKNOWN_EXTENSION
    timestamp = msgpack.Timestamp(1, 0)
    assert reason_of(lambda: decode_message(packb_update(metrics={"extra": {"t": timestamp}}))) is (
        Reason.UNKNOWN_EXTENSION
    )


def test_timestamps_of_invalid_length_are_rejected() -> None:
    assert reason_of(lambda: decode(ext_with_code(-1, b"\0" * 5))) in (Reason.MALFORMED, Reason.UNKNOWN_EXTENSION)


def test_a_message_of_many_empty_containers_is_refused_before_it_builds_them() -> None:
    """1 byte on the wire (an empty list) is a 56-byte Python object: the items of one message are bounded."""
    limits = DecodeLimits(max_items=1_000)
    fits = msgpack.packb([[] for _ in range(1_000)])
    assert isinstance(decode(fits, limits), list)
    many = msgpack.packb([[] for _ in range(600)] + [{} for _ in range(600)])
    assert reason_of(lambda: decode(many, limits)) is Reason.MALFORMED
    nested = msgpack.packb([[[] for _ in range(600)] for _ in range(2)])  # items at every depth count
    assert reason_of(lambda: decode(nested, limits)) is Reason.MALFORMED
