"""Forged chunks against an agent's and the reassembler's transfers (found in review): a forged chunk reusing a
genuine, public transfer id with another header and arriving first decided the header, so every genuine chunk was
refused; a piece too large for its transfer voided the genuine transfer; forged transfer starts evicted the genuine
one; empty pieces held entries free of the byte quotas; a transfer the decode limits refuse was buffered whole before
being refused. The agent now also refuses unsigned chunks before holding them (the reassembler-level cases stay:
a receiver without keys takes chunks unverified)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from edge_agent.global_states import STATE_LIMITS as _STATE_LIMITS
from protocol.digest import digest_bytes
from protocol.errors import ProtocolError
from protocol.messages import Chunk, GlobalState
from protocol.transport.chunking import CHUNK_OVERHEAD_BYTES, Reassembler, receive, split_payload
from protocol.wire import decode_message, encode_message
from tests.unit.edge_agent.test_agent_faults import TOPICS
from tests.unit.edge_agent.test_freshness import B, coordinator, make_agent, signed_chunks
from tests.unit.edge_agent.test_receiver_attacks import big_state


def _forged_first(first: Chunk) -> Chunk:
    # Same transfer id (readable from the retained chunk topics), another digest/total: garbage.
    return Chunk(transfer_id=first.transfer_id, index=0, count=first.count, total_bytes=first.total_bytes + 1,
                 digest="0" * 32, data=b"y")


def test_reassembler_a_forged_header_arriving_first_does_not_void_the_genuine_transfer() -> None:
    payload = bytes(range(256)) * 20
    pieces = split_payload(payload, CHUNK_OVERHEAD_BYTES + 512)
    first = decode_message(pieces[0], Chunk)
    r = Reassembler(max_transfers=4, max_transfers_per_source=4)
    r.add("coordinator", _forged_first(first))
    whole = None
    for piece in pieces:
        try:
            whole = r.add("coordinator", decode_message(piece, Chunk)) or whole
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion below
            whole = whole or exc
    assert whole == payload, f"genuine transfer never completed: {whole!r}"[:300]


def test_agent_late_subscriber_gets_genuine_state_despite_a_forged_retained_chunk(tmp_path: Path) -> None:
    """Retained chunks reach a late subscriber in no particular order; an attacker retains a forged chunk with the
    genuine transfer id on a chunk topic the coordinator does not use, and it happens to come first."""
    agent, _, _ = make_agent(tmp_path)
    coordinator(agent, B)
    state = big_state(B, 2)
    pieces = signed_chunks(state, CHUNK_OVERHEAD_BYTES + 512)
    first = decode_message(pieces[0], Chunk)
    agent._on_message(TOPICS.global_state_chunk("f", 2, len(pieces)), encode_message(_forged_first(first)), True)
    for i, piece in enumerate(pieces):
        agent._on_message(TOPICS.global_state_chunk("f", 2, i), piece, True)
    assert 2 in agent.global_states, f"genuine state never assembled: {dict(agent.rejected)}"


def _oversized(first: Chunk, index: int) -> Chunk:
    return Chunk(transfer_id=first.transfer_id, index=index, count=first.count, total_bytes=first.total_bytes,
                 digest=first.digest, data=b"y" * (first.total_bytes + 1))


def test_reassembler_an_oversized_forged_piece_does_not_void_the_genuine_transfer() -> None:
    payload = bytes(range(256)) * 20
    pieces = [decode_message(p, Chunk) for p in split_payload(payload, CHUNK_OVERHEAD_BYTES + 512)]
    r = Reassembler(max_transfers=4, max_transfers_per_source=4)
    assert r.add("coordinator", pieces[0]) is None
    try:
        r.add("coordinator", _oversized(pieces[0], 1))
    except ProtocolError:
        pass  # the forged chunk is refused: fine
    whole = None
    for piece in pieces[1:]:
        whole = r.add("coordinator", piece)
    assert whole == payload


def test_agent_keeps_the_genuine_state_after_an_oversized_forged_piece(tmp_path: Path) -> None:
    agent, _, _ = make_agent(tmp_path)
    coordinator(agent, B)
    pieces = signed_chunks(big_state(B, 2), CHUNK_OVERHEAD_BYTES + 512)
    agent._on_message(TOPICS.global_state_chunk("f", 2, 0), pieces[0], True)
    agent._on_message(TOPICS.global_state_chunk("f", 2, 1),
                      encode_message(_oversized(decode_message(pieces[0], Chunk), 1)), False)
    for i, piece in enumerate(pieces[1:], start=1):
        agent._on_message(TOPICS.global_state_chunk("f", 2, i), piece, True)
    assert 2 in agent.global_states, f"genuine state dropped: {dict(agent.rejected)}"


@pytest.mark.parametrize(("count", "total_bytes", "data"), [(100_000, 1, b"x"), (2, 10, b"")])
def test_a_piece_without_data_or_more_pieces_than_bytes_is_refused(count: int, total_bytes: int, data: bytes) -> None:
    """Each such piece would hold an entry of the reassembler free of its byte quotas."""
    forged = Chunk.model_construct(transfer_id="ab" * 8, index=0, count=count, total_bytes=total_bytes,
                                   digest=digest_bytes(b"x"), data=data)
    with pytest.raises(ProtocolError, match="no more pieces than bytes"):
        receive(encode_message(forged), "a", GlobalState, Reassembler(), _STATE_LIMITS)


def test_a_transfer_declaring_more_than_the_decode_limits_is_refused_at_its_first_chunk() -> None:
    r = Reassembler(max_transfers=4, max_transfers_per_source=4)  # as EdgeAgent makes it
    chunk = Chunk(transfer_id="ab" * 8, index=0, count=2, total_bytes=_STATE_LIMITS.max_payload_bytes + 1,
                  digest=digest_bytes(b"x"), data=b"x" * 1000)
    with pytest.raises(ProtocolError):
        receive(encode_message(chunk), "coordinator", GlobalState, r, _STATE_LIMITS)


def test_forged_transfer_starts_do_not_evict_the_genuine_global_state(tmp_path: Path) -> None:
    """Every chunk an agent reassembles is the coordinator's and it holds four transfers: four forged transfer starts
    on any of the family's chunk topics evicted the state in progress, whose retained chunks come once. Unsigned,
    they are refused before they are held."""
    agent, _, _ = make_agent(tmp_path)
    coordinator(agent, B)
    pieces = signed_chunks(big_state(B, 2), CHUNK_OVERHEAD_BYTES + 512)
    for i, piece in enumerate(pieces):
        agent._on_message(TOPICS.global_state_chunk("f", 2, i), piece, True)
        if i == 0:
            for _ in range(4):
                junk = Chunk(transfer_id=secrets.token_hex(8), index=0, count=2, total_bytes=2,
                             digest=digest_bytes(b"xx"), data=b"x")
                agent._on_message(TOPICS.global_state_chunk("f", 2, 99), encode_message(junk), False)
    assert 2 in agent.global_states, f"genuine state never assembled: {dict(agent.rejected)}"
    assert agent.rejected["unsigned"] == 4


def test_the_coordinators_older_state_chunks_replayed_do_not_evict_the_newest(tmp_path: Path) -> None:
    """Signed, and each on its own round's topic, they verify (found in review): every chunk the agent reassembles is
    the coordinator's, four transfers at most, and they pushed out the state in progress. The oldest round's transfer
    now makes room first."""
    agent, _, _ = make_agent(tmp_path)
    coordinator(agent, B)
    size = CHUNK_OVERHEAD_BYTES + 512
    old = {n: signed_chunks(big_state(B, n), size) for n in (1, 2, 3, 4, 5)}  # recorded from the retained topics
    pieces = signed_chunks(big_state(B, 6), size)
    for i, piece in enumerate(pieces):
        agent._on_message(TOPICS.global_state_chunk("f", 6, i), piece, True)
        for n, chunks in old.items():  # first pieces only: each starts a transfer that never completes
            agent._on_message(TOPICS.global_state_chunk("f", n, 0), chunks[0], False)
    assert 6 in agent.global_states, f"round 6's state was evicted by replayed old chunks: {dict(agent.rejected)}"
