"""Chunk reassembly under a flood (found in review): senders holding incomplete transfers, each within its own
quota, filled the shared bytes or slots and kept every honest chunked update out for five minutes. The least
recently touched transfer now makes room."""
from __future__ import annotations

import secrets
from pathlib import Path

from protocol.digest import digest_bytes
from protocol.messages import Chunk
from protocol.transport.chunking import split_payload
from protocol.wire import encode_message
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, rejected, update

MAX_UPDATE = 64 * 1024


def _hold(engine, source: str) -> None:
    """Two chunks of a transfer that never completes, just under the per-sender quota (max_update_bytes)."""
    tid, total = secrets.token_hex(8), MAX_UPDATE
    for index, size in ((0, 32 * 1024), (1, 32 * 1024)):
        chunk = Chunk(transfer_id=tid, index=index, count=3, total_bytes=total, digest=digest_bytes(b"x"),
                      data=b"\0" * size)
        engine.on_message(TOPICS.update(source, 1), encode_message(chunk))


def test_four_senders_holding_incomplete_transfers_do_not_lock_out_honest_chunked_updates(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, max_update_bytes=MAX_UPDATE)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    assert engine.open is not None
    for liar in ("m1", "m2", "m3", "m4"):  # four enrolled (here: open enrollment) senders, or anyone on their topics
        _hold(engine, liar)
    for agent in ("a", "b"):
        for piece in split_payload(encode_message(update(engine, agent, 1)), 400):
            engine.on_message(TOPICS.update(agent, 1), piece)
    too_large = rejected(metrics, "too_large")
    assert set(engine.open.updates) == {"a", "b"}, (
        f"honest chunked updates refused ({too_large:.0f} too_large) while four senders each hold one "
        f"incomplete transfer under their own quota; accepted: {sorted(engine.open.updates)}")


def test_thirty_two_senders_with_two_tiny_transfers_each_do_not_lock_out_honest_chunked_updates(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)  # default max_update_bytes
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    for i in range(32):  # 64 messages of a few bytes each: every transfer slot taken for timeout_s (300 s)
        for _ in range(2):
            chunk = Chunk(transfer_id=secrets.token_hex(8), index=0, count=2, total_bytes=2, digest=digest_bytes(b"xx"),
                          data=b"x")
            engine.on_message(TOPICS.update(f"m{i}", 1), encode_message(chunk))
    for agent in ("a", "b"):
        for piece in split_payload(encode_message(update(engine, agent, 1)), 400):
            engine.on_message(TOPICS.update(agent, 1), piece)
    assert set(engine.open.updates) == {"a", "b"}, (
        f"honest chunked updates refused ({rejected(metrics, 'bad_chunk'):.0f} bad_chunk: too many transfers in "
        f"flight) after 64 tiny messages; accepted: {sorted(engine.open.updates)}")
