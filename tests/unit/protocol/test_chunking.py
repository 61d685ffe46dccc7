"""split_payload and Reassembler: any order, redeliveries, and every way a transfer can go bad."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.digest import digest_bytes
from protocol.errors import ProtocolError, Reason
from protocol.messages import Chunk
from protocol.transport.chunking import CHUNK_OVERHEAD_BYTES, Reassembler, split_payload
from protocol.wire import decode_message

FAST = settings(deadline=None, max_examples=50)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def chunks_of(payload: bytes, max_message_bytes: int) -> list[Chunk]:
    pieces = split_payload(payload, max_message_bytes)
    assert all(len(p) <= max_message_bytes for p in pieces)
    return [decode_message(p, expect=Chunk) for p in pieces]


def protocol_error(reason: Reason) -> pytest.RaisesExc[ProtocolError]:
    return pytest.raises(ProtocolError, match=f"^{reason.value}:")


def test_small_payloads_travel_whole() -> None:
    payload = b"x" * 1000
    assert split_payload(payload, 1000) == [payload]


def test_no_room_for_data_is_refused() -> None:
    with pytest.raises(ValueError):
        split_payload(b"x" * 1000, CHUNK_OVERHEAD_BYTES)


@FAST
@given(
    payload=st.binary(min_size=1, max_size=5000),
    max_message_bytes=st.integers(CHUNK_OVERHEAD_BYTES + 1, CHUNK_OVERHEAD_BYTES + 700),
    data=st.data(),
)
def test_round_trip_in_any_order_with_redeliveries(payload: bytes, max_message_bytes: int, data: st.DataObject) -> None:
    pieces = split_payload(payload, max_message_bytes)
    if len(pieces) == 1:
        assert pieces == [payload]
        return
    assert all(len(p) <= max_message_bytes for p in pieces), "an encoded chunk is over the broker's cap"
    chunks = [decode_message(p, expect=Chunk) for p in pieces]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert {(c.transfer_id, c.count, c.total_bytes, c.digest) for c in chunks} == {
        (chunks[0].transfer_id, len(chunks), len(payload), digest_bytes(payload))
    }
    # QoS 1: any order, any chunk possibly delivered again (also after completion)
    order = data.draw(st.permutations(chunks))
    repeats = data.draw(st.lists(st.sampled_from(chunks), max_size=5))
    deliveries = list(order[:-1]) + repeats + [order[-1]]
    reassembler = Reassembler()
    results = [reassembler.add("agent-1", c) for c in deliveries]
    assert results[-1] == payload
    assert all(r is None for r in results[:-1])
    assert reassembler.in_flight == 0


def test_interleaved_transfers_from_several_sources() -> None:
    first, second = b"a" * 3000, b"b" * 2500
    a_chunks, b_chunks = chunks_of(first, 1000), chunks_of(second, 1000)
    reassembler = Reassembler()
    done = {}
    for pair in zip(a_chunks, b_chunks, strict=False):
        for source, chunk in zip(("a", "b"), pair, strict=True):
            result = reassembler.add(source, chunk)
            if result is not None:
                done[source] = result
    for chunk in a_chunks[len(b_chunks):]:
        if (result := reassembler.add("a", chunk)) is not None:
            done["a"] = result
    assert done == {"a": first, "b": second}


def test_chunks_from_another_source_cannot_complete_a_transfer() -> None:
    payload = bytes(range(256)) * 10
    chunks = chunks_of(payload, 600)
    assert len(chunks) >= 3
    reassembler = Reassembler()
    for chunk in chunks[:-1]:
        assert reassembler.add("victim", chunk) is None
    # The same transfer id from someone else only opens a transfer of their own.
    assert reassembler.add("intruder", chunks[-1]) is None
    assert reassembler.in_flight == 2
    assert reassembler.add("victim", chunks[-1]) == payload


def test_a_poisoned_chunk_from_another_source_does_not_disturb_the_transfer() -> None:
    payload = b"\x01" * 2000
    chunks = chunks_of(payload, 600)
    reassembler = Reassembler()
    reassembler.add("victim", chunks[0])
    forged = chunks[1].model_copy(update={"data": b"\xff" * len(chunks[1].data)})
    assert reassembler.add("intruder", forged) is None
    results = [reassembler.add("victim", c) for c in chunks[1:]]
    assert results[-1] == payload


def test_digest_mismatch() -> None:
    payload = b"\x00" * 2000
    chunks = chunks_of(payload, 600)
    tampered = chunks[1].model_copy(update={"data": b"\x01" * len(chunks[1].data)})
    reassembler = Reassembler()
    for chunk in [chunks[0], tampered, *chunks[2:-1]]:
        assert reassembler.add("a", chunk) is None
    with protocol_error(Reason.DIGEST_MISMATCH):
        reassembler.add("a", chunks[-1])
    assert reassembler.in_flight == 0


def test_short_chunks_fail_the_digest() -> None:
    chunks = chunks_of(b"\x07" * 2000, 600)
    short = chunks[0].model_copy(update={"data": chunks[0].data[:-1]})
    reassembler = Reassembler()
    for chunk in [short, *chunks[1:-1]]:
        reassembler.add("a", chunk)
    with protocol_error(Reason.DIGEST_MISMATCH):
        reassembler.add("a", chunks[-1])


def test_chunks_over_the_declared_size_are_refused() -> None:
    chunks = chunks_of(b"\x07" * 2000, 600)
    reassembler = Reassembler()
    reassembler.add("a", chunks[0])
    swollen = chunks[1].model_copy(update={"data": b"\x07" * 2000})
    with protocol_error(Reason.TOO_LARGE):
        reassembler.add("a", swollen)
    assert reassembler.in_flight == 1  # the chunk went, not the transfer: its header is public
    assert [reassembler.add("a", c) for c in chunks[1:]][-1] == b"\x07" * 2000


@pytest.mark.parametrize("field", ["count", "total_bytes", "digest"])
@pytest.mark.parametrize("first", [False, True])
def test_a_chunk_that_disagrees_with_its_transfer_starts_its_own(field: str, first: bool) -> None:
    """A transfer id is public (retained chunk topics can be read): a chunk with another header must not void the
    transfer, nor, arriving first (retained chunks reach a late subscriber in no order), decide its header."""
    payload = b"\x07" * 2000
    chunks = chunks_of(payload, 600)
    changed = {"count": chunks[1].count + 1, "total_bytes": chunks[1].total_bytes + 1, "digest": "0" * 32}[field]
    forged = chunks[1].model_copy(update={field: changed})
    reassembler = Reassembler()
    if first:
        reassembler.add("a", forged)
    reassembler.add("a", chunks[0])
    if not first:
        reassembler.add("a", forged)
    assert reassembler.in_flight == 2  # the genuine transfer and the forged one, which never completes
    assert [reassembler.add("a", c) for c in chunks[1:]][-1] == payload


def test_a_new_transfer_past_the_slots_evicts_the_least_recently_touched() -> None:
    """Transfers left incomplete (a liar's, or a device that died mid-send) cannot keep out the ones still coming."""
    reassembler = Reassembler(max_transfers=2)
    transfers = [chunks_of(bytes([i]) * 1000, 664) for i in range(3)]
    assert len(transfers[0]) == 3
    reassembler.add("a", transfers[0][0])
    reassembler.add("b", transfers[1][0])
    reassembler.add("a", transfers[0][1])  # a's is touched after b's
    assert reassembler.add("c", transfers[2][0]) is None  # b's, the least recently touched, makes room
    assert reassembler.in_flight == 2
    assert reassembler.add("a", transfers[0][2]) == bytes([0]) * 1000
    assert [reassembler.add("c", c) for c in transfers[2][1:]][-1] == bytes([2]) * 1000
    assert reassembler.add("b", transfers[1][1]) is None  # b's starts again: its first piece went
    assert reassembler.in_flight == 1


def test_a_source_past_its_own_slots_evicts_its_own_stalest_transfer() -> None:
    reassembler = Reassembler(max_transfers_per_source=1)
    old, new = chunks_of(b"o" * 1000, 664), chunks_of(b"n" * 1000, 664)
    reassembler.add("b", chunks_of(b"b" * 1000, 664)[0])
    reassembler.add("a", old[0])
    assert [reassembler.add("a", c) for c in new][-1] == b"n" * 1000  # a's older transfer went, not b's
    assert reassembler.in_flight == 1


def test_a_transfer_over_max_bytes_is_refused_up_front() -> None:
    reassembler = Reassembler(max_bytes=1500)
    with protocol_error(Reason.TOO_LARGE):
        reassembler.add("a", chunks_of(b"x" * 2000, 664)[0])
    assert reassembler.in_flight == 0


def test_held_bytes_across_transfers_are_bounded_by_evicting_the_least_recently_touched() -> None:
    reassembler = Reassembler(max_bytes=1200)
    first, second = chunks_of(b"x" * 1000, 664), chunks_of(b"y" * 1000, 664)
    piece = len(first[0].data)
    assert 3 * piece <= 1200 < 4 * piece
    reassembler.add("b", second[0])
    for chunk in first[:2]:
        reassembler.add("a", chunk)
    assert reassembler.add("a", first[2]) == b"x" * 1000  # b's piece made room
    assert reassembler.in_flight == 0
    with protocol_error(Reason.TOO_LARGE):  # what one transfer alone cannot fit is still refused
        Reassembler(max_bytes=1200, max_bytes_per_source=1200).add("a", chunks_of(b"z" * 1300, 664)[0])


def test_stale_transfers_expire() -> None:
    clock = FakeClock()
    reassembler = Reassembler(timeout_s=30.0, clock=clock)
    payload = b"z" * 2000
    chunks = chunks_of(payload, 600)
    reassembler.add("a", chunks[0])
    clock.now += 29.0
    reassembler.add("a", chunks[1])
    assert reassembler.in_flight == 1
    clock.now += 2.0  # 31 s after the transfer started
    # The late chunk opens a fresh transfer: the expired pieces are gone.
    results = [reassembler.add("a", c) for c in chunks[2:]]
    assert results == [None] * len(results)
    assert reassembler.in_flight == 1
    # Sent again in full, it completes.
    results = [reassembler.add("a", c) for c in chunks[:2]]
    assert results[-1] == payload
    assert reassembler.in_flight == 0


def test_an_idle_transfer_expires_before_the_overall_timeout() -> None:
    clock = FakeClock()
    reassembler = Reassembler(timeout_s=300.0, idle_timeout_s=10.0, clock=clock)
    chunks = chunks_of(b"a" * 2000, 600)
    reassembler.add("a", chunks[0])
    clock.now += 9.0
    reassembler.add("a", chunks[1])  # progress: not idle
    clock.now += 9.0
    assert reassembler.in_flight == 1
    clock.now += 2.0  # 11 s since its last chunk
    reassembler.add("b", chunks_of(b"b" * 1000, 600)[0])
    assert reassembler.in_flight == 1  # a's went idle and expired
