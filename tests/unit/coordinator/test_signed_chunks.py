"""Signed chunks at the coordinator (found in review: chunks were taken on trust until their transfer completed). With
enrollment required, anyone who may publish on an agent's update topic could start transfers there and evict the
agent's chunked update in progress (the per-sender quota is two transfers); now each chunk is taken for what its
signature proves before it is held: a forged one, one signed by another enrolled agent, and one replayed from another
round's topic are refused and take no slot; an agent's genuine chunks of an earlier round, replayed on that round's
topic (they verify), are refused as late before they are held (found in review of the signed chunks)."""

from __future__ import annotations

import secrets
from pathlib import Path

from coordinator.fleet.enrollment import enroll
from protocol.digest import digest_bytes
from protocol.messages import Chunk
from protocol.transport.chunking import split_payload
from protocol.wire import encode_message
from tests.unit.coordinator.test_engine import TOPICS, Clock, make_engine, update
from tests.unit.coordinator.test_enrollment import KEYS, rejected, signed_status


def forged_start() -> bytes:
    return encode_message(Chunk(transfer_id=secrets.token_hex(8), index=0, count=2, total_bytes=2,
                                digest=digest_bytes(b"xx"), data=b"x"))


def test_forged_and_misdirected_chunks_neither_are_held_nor_evict_a_genuine_chunked_update(tmp_path: Path) -> None:
    for agent in ("a", "b", "mallory"):
        enroll(tmp_path / "state" / "enrolled.json", agent, KEYS[agent].public_key)
    engine, _, metrics = make_engine(tmp_path, Clock(), enrollment="required")
    for agent in ("a", "b"):
        engine.on_message(TOPICS.agent_status(agent), signed_status(agent, KEYS[agent]))
    engine.tick()
    assert engine.open is not None and engine.open.number == 1
    topic = TOPICS.update("a", 1)
    sealed = encode_message(KEYS["a"].seal(encode_message(update(engine, "a", 1))))
    pieces = split_payload(sealed, 400, KEYS["a"], topic)
    assert len(pieces) > 2
    mallorys = split_payload(encode_message(KEYS["mallory"].seal(encode_message(update(engine, "a", 1)))), 400,
                             KEYS["mallory"], topic)  # an enrolled agent signing for a's topic
    other_round = split_payload(sealed, 400, KEYS["a"], TOPICS.update("a", 7))  # a's own, for another topic
    for i, piece in enumerate(pieces):
        engine.on_message(topic, piece)
        for junk in (forged_start(), forged_start(), mallorys[i % len(mallorys)], other_round[i % len(other_round)]):
            engine.on_message(topic, junk)  # interleaved on a's topic: each would start a transfer of its own
        assert engine.parts.intake.reassembler.in_flight_of("a") <= 1
    assert "a" in engine.open.updates
    assert rejected(metrics, "update", "unsigned") == 2 * len(pieces)
    assert rejected(metrics, "update", "bad_signature") == 2 * len(pieces)  # mallory's key, another round's topic


def chunked(engine, agent: str, number: int) -> tuple[str, list[bytes]]:
    topic = TOPICS.update(agent, number)
    sealed = encode_message(KEYS[agent].seal(encode_message(update(engine, agent, number))))
    return topic, split_payload(sealed, 400, KEYS[agent], topic)


def test_old_rounds_chunks_replayed_on_their_own_topics_evict_the_open_rounds_transfer(tmp_path: Path) -> None:
    for agent in ("a", "b"):
        enroll(tmp_path / "state" / "enrolled.json", agent, KEYS[agent].public_key)
    engine, _, metrics = make_engine(tmp_path, Clock(), enrollment="required", rounds=5)
    for agent in ("a", "b"):
        engine.on_message(TOPICS.agent_status(agent), signed_status(agent, KEYS[agent]))
    engine.tick()
    recorded = {}
    for number in (1, 2):  # two ordinary rounds: what a sent is recorded by an eavesdropper
        assert engine.open is not None and engine.open.number == number
        for agent in ("a", "b"):
            topic, pieces = chunked(engine, agent, number)
            for piece in pieces:
                engine.on_message(topic, piece)
            if agent == "a":
                recorded[number] = (topic, pieces)
        engine.tick(), engine.tick()
    assert engine.open is not None and engine.open.number == 3
    topic, pieces = chunked(engine, "a", 3)
    assert len(pieces) > 2
    for i, piece in enumerate(pieces):
        engine.on_message(topic, piece)
        for old_topic, old in (recorded[1], recorded[2]):  # replays, each on its own (old) topic: they verify
            engine.on_message(old_topic, old[i % len(old)])
    assert "a" in engine.open.updates, "a's round-3 update was evicted by replays of its own round-1/2 chunks"
    assert rejected(metrics, "update", "late") >= len(pieces)
