"""PackedArray on the wire: every consistency rule rejects a crafted payload, packed arrays survive
encode_message/decode_message inside a message, and the decode limits apply to the arrays inside."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import pytest
from pydantic import Field, ValidationError

from protocol.arrays import all_finite
from protocol.compression import (
    MAX_PACKED_ELEMENTS,
    Compression,
    PackedArray,
    check_packed_layout,
    pack_arrays,
    unpack_arrays,
)
from protocol.errors import ProtocolError, Reason
from protocol.limits import DEFAULT_DTYPES, DecodeLimits
from protocol.messages import MESSAGE_TYPES, Message
from protocol.wire import decode_message, encode_message


class PackedProbe(Message):
    """A stand-in for the Update and RoundAnnouncement fields to come."""

    kind: Literal["packed_probe"] = "packed_probe"
    compression: Compression = "none"
    packed: dict[str, PackedArray] = Field(default_factory=dict, max_length=4096)


@pytest.fixture(autouse=True)
def _probe_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(MESSAGE_TYPES, "packed_probe", PackedProbe)


def good(kind: str) -> dict[str, Any]:
    """Valid PackedArray fields of ``kind`` for shape [2, 3], to be spoiled one rule at a time."""
    if kind == "fp16":
        return {"kind": "fp16", "shape": [2, 3], "dtype": "<f4", "values": np.arange(6, dtype=np.float16)}
    if kind == "int8":
        return {"kind": "int8", "shape": [2, 3], "dtype": "<f4", "values": np.arange(-3, 3, dtype=np.int8),
                "scale": 0.5}
    return {"kind": "topk", "shape": [2, 3], "dtype": "<f8", "values": np.array([1.5, -2.0], np.float32),
            "indices": np.array([1, 4], np.uint32)}


BAD: dict[str, tuple[str, dict[str, Any], str]] = {
    # name: (kind, changed fields, error type)
    "index out of range": ("topk", {"indices": np.array([1, 6], np.uint32)}, "bad_shape"),
    "indices unsorted": ("topk", {"indices": np.array([4, 1], np.uint32)}, "schema"),
    "indices repeat": ("topk", {"indices": np.array([4, 4], np.uint32)}, "schema"),
    "indices int64": ("topk", {"indices": np.array([1, 4], np.int64)}, "schema"),
    "indices 2-D": ("topk", {"indices": np.array([[1, 4]], np.uint32)}, "schema"),
    "indices and values differ in count": ("topk", {"indices": np.array([1, 2, 4], np.uint32)}, "bad_shape"),
    "indices missing": ("topk", {"indices": None}, "schema"),
    "topk values int8": ("topk", {"values": np.array([1, 2], np.int8)}, "schema"),
    "topk values float64": ("topk", {"values": np.array([1.0, 2.0])}, "schema"),
    "topk with a scale": ("topk", {"scale": 1.0}, "schema"),
    "fp16 values float32": ("fp16", {"values": np.arange(6, dtype=np.float32)}, "schema"),
    "fp16 values Inf": ("fp16", {"values": np.array([0, 1, 2, 3, 4, np.inf], np.float16)}, "non_finite"),
    "shape product mismatch": ("fp16", {"values": np.arange(5, dtype=np.float16)}, "bad_shape"),
    "values 2-D": ("fp16", {"values": np.zeros((2, 3), np.float16)}, "bad_shape"),
    "fp16 with indices": ("fp16", {"indices": np.arange(6, dtype=np.uint32)}, "schema"),
    "int8 values float16": ("int8", {"values": np.arange(6, dtype=np.float16)}, "schema"),
    "int8 value -128": ("int8", {"values": np.array([-128, 0, 0, 0, 0, 0], np.int8)}, "schema"),
    "int8 scale NaN": ("int8", {"scale": float("nan")}, "finite_number"),
    "int8 scale Inf": ("int8", {"scale": float("inf")}, "finite_number"),
    "int8 scale zero": ("int8", {"scale": 0.0}, "schema"),
    "int8 scale negative": ("int8", {"scale": -0.5}, "schema"),
    "int8 scale overflows float32": ("int8", {"scale": 1e37}, "schema"),
    "int8 scale underflows float32": ("int8", {"scale": 1e-50}, "schema"),
    "int8 scale missing": ("int8", {"scale": None}, "schema"),
    "int8 scale a string": ("int8", {"scale": "0.5"}, "float_type"),
    "huge shape": ("topk", {"shape": [2**16, 2**16]}, "bad_shape"),
    "dimension over the bound": ("topk", {"shape": [MAX_PACKED_ELEMENTS + 1]}, "less_than_equal"),
    "negative dimension": ("topk", {"shape": [-2, -3]}, "greater_than_equal"),
    "nine dimensions": ("topk", {"shape": [1] * 8 + [6]}, "too_long"),
    "shape of floats": ("topk", {"shape": [2.0, 3.0]}, "int_type"),
    "restore dtype float16": ("fp16", {"dtype": "<f2"}, "literal_error"),
    "restore dtype big-endian": ("fp16", {"dtype": ">f4"}, "literal_error"),
    "unknown kind": ("fp16", {"kind": "zstd"}, "schema"),  # only the announcing coordinator unpacks
    "kind not a name": ("fp16", {"kind": "fp/16"}, "string_pattern_mismatch"),
    "values not an array": ("fp16", {"values": [0.0] * 6}, "not_array"),
    "extra field": ("fp16", {"zero_point": 0}, "extra_forbidden"),
}


@pytest.mark.parametrize("kind", ["fp16", "int8", "topk"])
def test_the_good_ones_are_good(kind: str) -> None:
    PackedArray(**good(kind))


@pytest.mark.parametrize("name", list(BAD))
def test_every_rule_rejects_a_crafted_packed_array(name: str) -> None:
    kind, changes, error_type = BAD[name]
    with pytest.raises(ValidationError) as caught:
        PackedArray(**{**good(kind), **changes})
    assert caught.value.errors()[0]["type"] == error_type


def test_allowed_dtypes_include_the_packed_ones() -> None:
    assert {"<f2", "|i1", "<u4", "<f4"} <= DEFAULT_DTYPES


@pytest.mark.parametrize("spec", ["fp16", "int8", "topk:0.1", "topk:1.0"])
def test_packed_arrays_survive_the_wire(spec: str) -> None:
    rng = np.random.default_rng(1)
    arrays = {"w": rng.standard_normal((16, 9)).astype(np.float32), "b": rng.standard_normal(7), "s": np.ones(())}
    message = PackedProbe(compression=spec, packed=pack_arrays(arrays, spec, rng))
    decoded = decode_message(encode_message(message), expect=PackedProbe)
    assert decoded.compression == spec and decoded.packed.keys() == arrays.keys()
    for name, packed in message.packed.items():
        got = decoded.packed[name]
        assert (got.kind, got.shape, got.dtype, got.scale) == (packed.kind, packed.shape, packed.dtype, packed.scale)
        assert got.values.dtype == packed.values.dtype
        if got.values.size:  # a view of the payload (an empty top-k array, model-wide selection, is no view)
            assert not got.values.flags.writeable
        else:
            assert got.kind == "topk"
    before, after = unpack_arrays(message.packed), unpack_arrays(decoded.packed)
    for name, array in arrays.items():
        np.testing.assert_array_equal(before[name], after[name])
        assert after[name].dtype == array.dtype and after[name].shape == array.shape
    check_packed_layout(decoded.packed, {n: (a.shape, a.dtype.str) for n, a in arrays.items()}, "probe")


def crafted(kind: str, **changes: Any) -> bytes:
    """A probe carrying a PackedArray that was never validated, as a hostile sender would encode it."""
    packed = PackedArray.model_construct(**{**good(kind), **changes})
    return encode_message(PackedProbe.model_construct(kind="packed_probe", v=1, compression="none",
                                                      packed={"w": packed}))


@pytest.mark.parametrize(("kind", "changes", "reason"), [
    ("topk", {"indices": np.array([1, 6], np.uint32)}, Reason.BAD_SHAPE),
    ("topk", {"indices": np.array([4, 1], np.uint32)}, Reason.SCHEMA),
    ("topk", {"shape": [2**20, 2**20]}, Reason.BAD_SHAPE),  # 2 values on the wire, 2**40 entries to unpack
    ("int8", {"scale": float("nan")}, Reason.NON_FINITE),
    ("int8", {"values": np.arange(6, dtype=np.int16)}, Reason.SCHEMA),
    ("fp16", {"values": np.arange(5, dtype=np.float16)}, Reason.BAD_SHAPE),
])
def test_crafted_packed_payloads_are_protocol_errors(kind: str, changes: dict[str, Any], reason: Reason) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_message(crafted(kind, **changes), expect=PackedProbe)
    assert caught.value.reason is reason


def test_bad_compression_text_of_a_known_kind_is_a_schema_error() -> None:
    payload = encode_message(PackedProbe.model_construct(kind="packed_probe", v=1, compression="topk:2", packed={}))
    with pytest.raises(ProtocolError, match=r"topk fraction must be in \(0, 1\]") as caught:
        decode_message(payload)
    assert caught.value.reason is Reason.SCHEMA
    for text in ("fp16:2", "gz/ip", "zstd level", ":3", ""):
        with pytest.raises(ValidationError):
            PackedProbe(compression=text)


@pytest.mark.parametrize("text", ["gzip", "zstd:3", "lz4:fast-1"])
def test_an_unknown_compressor_decodes_so_an_older_agent_can_decline_it(text: str) -> None:
    """The compressor is an open set on the wire; settings still accept only registered ones."""
    from protocol.compression import CompressionSpec

    decoded = decode_message(encode_message(PackedProbe(compression=text)), expect=PackedProbe)
    assert decoded.compression == text
    with pytest.raises(ValueError, match="unknown compression"):
        CompressionSpec.parse(text)


def test_decode_limits_apply_to_the_arrays_inside() -> None:
    payload = encode_message(PackedProbe(packed=pack_arrays({"w": np.ones(1000, np.float32)}, "int8")))
    decode_message(payload, limits=DecodeLimits(max_array_elements=1000))
    with pytest.raises(ProtocolError) as caught:
        decode_message(payload, limits=DecodeLimits(max_array_elements=999))
    assert caught.value.reason is Reason.TOO_MANY_ELEMENTS
    with pytest.raises(ProtocolError) as caught:
        decode_message(payload, limits=DecodeLimits(allowed_dtypes=DEFAULT_DTYPES - {"|i1"}))
    assert caught.value.reason is Reason.BAD_DTYPE
    topk = encode_message(PackedProbe(packed=pack_arrays({"w": np.ones(1000, np.float32)}, "topk:0.5")))
    with pytest.raises(ProtocolError) as caught:  # values and indices both count: 500 + 500 elements
        decode_message(topk, limits=DecodeLimits(max_total_elements=999))
    assert caught.value.reason is Reason.TOO_MANY_ELEMENTS


def test_check_packed_layout_before_unpacking() -> None:
    packed = pack_arrays({"w": np.ones((4, 5), np.float32)}, "topk:0.1")
    check_packed_layout(packed, {"w": ((4, 5), "<f4")}, "update")
    for expected in ({"w": ((5, 4), "<f4")}, {"w": ((4, 5), "<f8")}, {"v": ((4, 5), "<f4")}, {}):
        with pytest.raises(ProtocolError) as caught:
            check_packed_layout(packed, expected, "update")
        assert caught.value.reason is Reason.BAD_SHAPE


@pytest.mark.parametrize("order", ["<", ">"])
def test_all_finite_reads_float16_bits(order: str) -> None:
    for values, finite in [([1, -2, 65504, 6e-8], True), ([1, np.inf], False), ([-np.inf], False), ([np.nan], False),
                           ([], True)]:
        array = np.array(values, dtype=np.float16).astype(order + "f2")
        assert all_finite(array) is finite and all_finite(np.repeat(array, 2)[::2]) is finite
