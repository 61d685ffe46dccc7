"""Anything malformed raises ProtocolError with the right Reason, and never anything else."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.arrays import check_layout, layout_of
from protocol.codec import EXT_NDARRAY, decode, encode
from protocol.errors import ProtocolError, Reason
from protocol.limits import DecodeLimits
from protocol.messages import AgentStatus, Chunk, GlobalState, Update
from protocol.version import SCHEMA_VERSION
from protocol.wire import decode_message, encode_message

from .wire_strategies import assert_same_message, sample_update

FUZZ = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])


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


def test_the_helpers_build_valid_messages() -> None:
    # Guards every test below: they differ from a valid message only in what they break.
    assert_same_message(sample_update(), decode_message(VALID_UPDATE, expect=Update))
    assert_same_message(sample_update(), decode_message(packb_update(), expect=Update))
    assert_same_message(sample_update(), decode_message(encode(update_dict()), expect=Update))


# ---------------------------------------------------------------------------- bytes


def test_every_prefix_of_a_valid_update_is_malformed() -> None:
    for end in range(len(VALID_UPDATE)):
        assert reason_of(lambda: decode_message(VALID_UPDATE[:end])) is Reason.MALFORMED, end


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


@pytest.mark.parametrize("dims", [(2**64 - 1,), (2**32, 2**32), (2**63, 2**63, 0, 5)])
def test_absurd_dimensions_never_escape_as_other_errors(dims: tuple[int, ...]) -> None:
    payload = msgpack.packb(ext_array(b"<f4", dims, b""))
    lax = DecodeLimits(max_array_elements=2**62, max_total_elements=2**62)
    for limits in (DecodeLimits(), lax):
        assert reason_of(lambda: decode(payload, limits)) in (Reason.TOO_MANY_ELEMENTS, Reason.MALFORMED)


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


# ---------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"round": "3"}, id="round-as-string"),
        pytest.param({"round": 3.0}, id="round-as-float"),
        pytest.param({"round": -1}, id="negative-round"),
        pytest.param({"round": 10_000_001}, id="round-too-large"),
        pytest.param({"num_samples": -1}, id="negative-samples"),
        pytest.param({"num_samples": True}, id="bool-as-int"),
        pytest.param({"agent_id": "bad/id"}, id="slash-in-id"),
        pytest.param({"agent_id": "a+"}, id="wildcard-in-id"),
        pytest.param({"agent_id": ""}, id="empty-id"),
        pytest.param({"agent_id": "a" * 65}, id="id-too-long"),
        pytest.param({"agent_id": "abc\n"}, id="trailing-newline-id"),
        pytest.param({"agent_id": b"agent-0"}, id="id-as-bytes"),
        pytest.param({"task": "sleep"}, id="unknown-task"),
        pytest.param({"base_digest": "XYZ"}, id="bad-digest"),
        pytest.param({"delta": {"w": [1.0, 2.0]}}, id="list-as-array"),
        pytest.param({"delta": [1.0]}, id="list-as-arrays"),
        pytest.param({"delta": {"w": 1.0}}, id="float-as-array"),
        pytest.param({"metrics": 5}, id="metrics-as-int"),
        pytest.param({"metrics": {"steps": -1}}, id="negative-steps"),
        pytest.param({"metrics": {"train_accuracy": 1.5}}, id="accuracy-over-one"),
        pytest.param({"metrics": {"surprise": 1}}, id="unknown-metric"),
        pytest.param({"privacy": {"epsilon": 1.0, "delta": 1.0}}, id="delta-of-one"),
        pytest.param({"surprise": 1}, id="unknown-field"),
        pytest.param({"weights": {"w": np.ones(2, dtype="<f4")}}, id="weights-and-delta"),
        pytest.param({"task": "evaluate"}, id="evaluation-with-payload"),
        pytest.param({"prototypes": np.ones((2, 3), dtype="<f4")}, id="prototypes-without-counts"),
        pytest.param({"prototypes": np.ones((2, 3), dtype="<f4"), "prototype_counts": np.ones(2, dtype="<i8")},
                     id="prototypes-with-delta"),
        pytest.param({"delta": {}, "control_delta": {"w": np.ones(2, dtype="<f4")}}, id="control-delta-alone"),
        pytest.param({"delta": {}, "task": "evaluate", "control_delta": {"w": np.ones(2, dtype="<f4")}},
                     id="evaluation-with-control-delta"),
    ],
)
def test_wrong_field_types_and_values_are_schema_errors(overrides: dict[str, Any]) -> None:
    assert reason_of(lambda: decode_message(encode(update_dict(**overrides)))) is Reason.SCHEMA


@pytest.mark.parametrize("field", ["run_id", "agent_id", "round", "task", "family", "num_samples", "metrics",
                                   "base_digest"])
def test_missing_fields_are_schema_errors(field: str) -> None:
    data = update_dict()
    del data[field]
    assert reason_of(lambda: decode_message(encode(data))) is Reason.SCHEMA


@pytest.mark.parametrize("value", [None, 1, 1.5, "update", b"x", [1, 2], np.zeros(3)])
def test_top_level_must_be_a_map(value: Any) -> None:
    assert reason_of(lambda: decode_message(encode(value))) is Reason.SCHEMA


@pytest.mark.parametrize("version", [0, 2, -1, 2**40, "1", None, [1]])
def test_unsupported_schema_versions(version: Any) -> None:
    assert reason_of(lambda: decode_message(encode(update_dict(v=version)))) is Reason.UNSUPPORTED_VERSION


def test_missing_schema_version() -> None:
    data = update_dict()
    del data["v"]
    assert reason_of(lambda: decode_message(encode(data))) is Reason.UNSUPPORTED_VERSION


@pytest.mark.parametrize("kind", ["nope", "", "Update", 7, None, ["update"]])
def test_unknown_kinds_are_schema_errors(kind: Any) -> None:
    assert reason_of(lambda: decode_message(encode(update_dict(kind=kind)))) is Reason.SCHEMA


def test_schema_is_checked_after_the_version() -> None:
    assert reason_of(lambda: decode_message(encode({"v": SCHEMA_VERSION + 1, "kind": "nope"}))) is (
        Reason.UNSUPPORTED_VERSION
    )


@pytest.mark.parametrize("expect", [AgentStatus, GlobalState, Chunk])
def test_wrong_kind_when_another_is_expected(expect: type) -> None:
    assert reason_of(lambda: decode_message(VALID_UPDATE, expect=expect)) is Reason.WRONG_KIND
    assert isinstance(decode_message(VALID_UPDATE, expect=Update), Update)


# ---------------------------------------------------------------------------- values


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
@pytest.mark.parametrize("field", ["delta", "weights", "control_delta"])
def test_non_finite_arrays_are_rejected(bad: float, dtype: str, field: str) -> None:
    array = np.ones((2, 3), dtype=dtype)
    array[1, 2] = bad
    overrides: dict[str, Any] = {field: {"w": array}}
    if field == "weights":
        overrides["delta"] = {}
    assert reason_of(lambda: decode_message(encode(update_dict(**overrides)))) is Reason.NON_FINITE


def test_non_finite_prototypes_are_rejected() -> None:
    protos = np.ones((2, 3), dtype="<f4")
    protos[0, 0] = np.nan
    message = update_dict(prototypes=protos, prototype_counts=np.array([1, 2], dtype="<i8"), delta={})
    assert reason_of(lambda: decode_message(encode(message))) is Reason.NON_FINITE


def test_non_finite_global_weights_are_rejected() -> None:
    weights = {"w": np.array([1.0, np.inf], dtype="<f4")}
    message = {"v": 1, "kind": "global_state", "run_id": "r", "family": "f", "round": 0,
               "digest": GlobalState.compute_digest(weights, {}, None, None), "weights": weights}
    assert reason_of(lambda: decode_message(encode(message))) is Reason.NON_FINITE


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_metrics_are_rejected(bad: float) -> None:
    metrics = {"train_loss": bad}
    assert reason_of(lambda: decode_message(encode(update_dict(metrics=metrics)))) is Reason.NON_FINITE


def test_integer_arrays_have_no_finiteness_to_check() -> None:
    message = decode_message(encode(update_dict(delta={"n": np.array([2**63 - 1], dtype="<i8")})), expect=Update)
    assert message.delta["n"][0] == 2**63 - 1


@pytest.mark.parametrize(
    ("prototypes", "counts"),
    [
        pytest.param(np.ones(3, dtype="<f4"), np.ones(3, dtype="<i8"), id="1d-prototypes"),
        pytest.param(np.ones((2, 3, 1), dtype="<f4"), np.ones(2, dtype="<i8"), id="3d-prototypes"),
        pytest.param(np.ones((2, 3), dtype="<i4"), np.ones(2, dtype="<i8"), id="integer-prototypes"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.ones(3, dtype="<i8"), id="counts-too-long"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.ones((2, 1), dtype="<i8"), id="counts-2d"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.ones(2, dtype="<f4"), id="float-counts"),
        pytest.param(np.ones((2, 3), dtype="<f4"), np.array([1, -1], dtype="<i8"), id="negative-count"),
    ],
)
def test_prototypes_of_the_wrong_shape_are_bad_shape(prototypes: np.ndarray, counts: np.ndarray) -> None:
    message = update_dict(prototypes=prototypes, prototype_counts=counts, delta={})
    assert reason_of(lambda: decode_message(encode(message))) is Reason.BAD_SHAPE


LAYOUT = layout_of(sample_update().delta)


@pytest.mark.parametrize(
    "delta",
    [
        pytest.param({"conv.weight": np.zeros((3, 2, 2), "<f4"), "conv.bias": np.zeros(3, "<f4")}, id="missing"),
        pytest.param({**sample_update().delta, "extra": np.zeros(1, "<f4")}, id="extra"),
        pytest.param({**sample_update().delta, "conv.bias": np.zeros(4, "<f4")}, id="longer"),
        pytest.param({**sample_update().delta, "conv.bias": np.zeros((3, 1), "<f4")}, id="reshaped"),
        pytest.param({**sample_update().delta, "conv.weight": np.zeros((2, 3, 2), "<f4")}, id="permuted"),
        pytest.param({**sample_update().delta, "conv.bias": np.zeros(3, "<f8")}, id="wider-dtype"),
        pytest.param({**sample_update().delta, "steps": np.array([7], "<i8")}, id="0d-as-1d"),
        pytest.param({**sample_update().delta, "steps": np.array(7, "<i4")}, id="narrower-int"),
    ],
)
def test_layout_mismatch_after_decoding_is_bad_shape(delta: dict[str, np.ndarray]) -> None:
    message = decode_message(encode_message(sample_update(delta=delta)), expect=Update)
    assert reason_of(lambda: check_layout(message.delta, LAYOUT, "delta")) is Reason.BAD_SHAPE


def test_matching_layout_passes() -> None:
    message = decode_message(VALID_UPDATE, expect=Update)
    check_layout(message.delta, LAYOUT, "delta")


def _global_state_dict() -> dict[str, Any]:
    weights = {"w": np.arange(6, dtype="<f4").reshape(2, 3), "n": np.array(3, dtype="<i8")}
    digest = GlobalState.compute_digest(weights, {}, None, None)
    return GlobalState(run_id="run", family="cnn", round=4, digest=digest, weights=weights).model_dump()


def test_global_state_with_a_wrong_digest() -> None:
    data = _global_state_dict()
    assert isinstance(decode_message(encode(data), expect=GlobalState), GlobalState)
    wrong = {**data, "digest": "f" * 32 if data["digest"] != "f" * 32 else "e" * 32}
    assert reason_of(lambda: decode_message(encode(wrong))) is Reason.DIGEST_MISMATCH


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda d: {**d, "weights": {**d["weights"], "w": d["weights"]["w"] + 1}}, id="value"),
        pytest.param(lambda d: {**d, "weights": {**d["weights"], "w": d["weights"]["w"].reshape(3, 2)}}, id="shape"),
        pytest.param(lambda d: {**d, "weights": {**d["weights"], "w": d["weights"]["w"].astype("<f8")}}, id="dtype"),
        pytest.param(lambda d: {**d, "weights": {"v": d["weights"]["w"], "n": d["weights"]["n"]}}, id="name"),
        pytest.param(lambda d: {**d, "weights": {"n": d["weights"]["n"], "w": d["weights"]["w"]}}, id="order"),
        pytest.param(lambda d: {**d, "control": {"w": d["weights"]["w"]}}, id="control"),
        pytest.param(lambda d: {**d, "weights": {}, "control": d["weights"]}, id="group"),
    ],
)
def test_global_state_with_tampered_content(tamper: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    assert reason_of(lambda: decode_message(encode(tamper(_global_state_dict())))) is Reason.DIGEST_MISMATCH
