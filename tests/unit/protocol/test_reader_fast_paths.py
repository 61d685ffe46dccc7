"""protocol/reader.py reads map keys and common values in place, skipping value()'s dispatch: the same
answers and the same refusals as the general path, against msgpack itself as the reference."""

from __future__ import annotations

import array
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError, Reason
from protocol.limits import DEFAULT_LIMITS
from protocol.reader import MAX_DEPTH, read_message

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                    st.text(max_size=40), st.binary(max_size=40))
trees = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                      st.dictionaries(st.text(max_size=40), inner, max_size=6)),
                     max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(st.text(max_size=40), trees, max_size=8))
def test_maps_read_as_msgpack_reads_them(value: dict[str, Any]) -> None:
    packed = msgpack.packb(value, use_bin_type=True)
    assert read_message(packed, DEFAULT_LIMITS) == msgpack.unpackb(packed, raw=False)


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(st.text(min_size=1, max_size=40), trees, min_size=1, max_size=8), data=st.data())
def test_every_truncation_is_refused_as_malformed(value: dict[str, Any], data: st.DataObject) -> None:
    packed = msgpack.packb(value, use_bin_type=True)
    cut = data.draw(st.integers(1, len(packed) - 1))
    with pytest.raises(ProtocolError) as refused:
        read_message(packed[:cut], DEFAULT_LIMITS)
    assert refused.value.reason == Reason.MALFORMED


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        value = {"k": value}
    return value


def test_nesting_is_bounded_for_keys_read_in_place() -> None:
    assert read_message(msgpack.packb(nested(MAX_DEPTH - 1)), DEFAULT_LIMITS) == nested(MAX_DEPTH - 1)
    with pytest.raises(ProtocolError, match=f"nesting deeper than {MAX_DEPTH}"):
        read_message(msgpack.packb(nested(MAX_DEPTH)), DEFAULT_LIMITS)


@pytest.mark.parametrize("payload", [
    b"\x81\xa2\xff\xfe\x01",  # a fixstr key that is not UTF-8
    b"\x81\xa1k\xa2\xff\xfe",  # a fixstr value that is not UTF-8
    b"\x82\xa1k\x01\xa1k\x02",  # a key read in place, repeated
    b"\x81\x01\x01",  # an integer key
    b"\x81\xa1k\xc1",  # 0xc1 is no msgpack type
])
def test_bad_maps_are_refused_as_malformed(payload: bytes) -> None:
    with pytest.raises(ProtocolError) as refused:
        read_message(payload, DEFAULT_LIMITS)
    assert refused.value.reason == Reason.MALFORMED


def test_a_view_of_wider_items_is_read_as_its_bytes() -> None:
    packed = msgpack.packb({"agent_id": "a1", "n": 3, "none": None, "t": 1.5})
    packed += b"\xc0" * (-len(packed) % 2)  # whole 16-bit items; the padding is extra data
    wide = memoryview(array.array("H", packed))
    with pytest.raises(ProtocolError, match="extra data"):
        read_message(wide, DEFAULT_LIMITS)
    exact = msgpack.packb({"a": 1, "bb": "xy"})
    assert len(exact) % 2 == 0
    assert read_message(memoryview(array.array("H", exact)), DEFAULT_LIMITS) == {"a": 1, "bb": "xy"}
