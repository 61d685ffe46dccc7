"""Signed envelopes: what verifies, what does not, and what each receiver accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.errors import ProtocolError
from protocol.limits import DEFAULT_LIMITS
from protocol.security.signing import PublicKey, SigningKey, single_key
from protocol.security.trust import OPEN, Trust, decode_trusted
from protocol.transport.chunking import Reassembler, receive, split_payload
from protocol.wire import encode_message
from service_kit.keys import load_or_create_signing_key
from tests.unit.protocol.wire_strategies import assert_same_message, sample_update

COORDINATOR = SigningKey.generate()
TRUSTED = Trust(single_key("coordinator", COORDINATOR.public_key), required=True)


def sealed(key: SigningKey, payload: bytes) -> bytes:
    return encode_message(key.seal(payload))


def test_a_signed_message_verifies_and_names_its_signer() -> None:
    plain = encode_message(sample_update())
    received = decode_trusted(sealed(COORDINATOR, plain), type(sample_update()), DEFAULT_LIMITS, TRUSTED)
    assert received.signer == "coordinator"
    assert_same_message(received.message, sample_update())
    assert sealed(COORDINATOR, plain) == sealed(COORDINATOR, plain), "Ed25519 is deterministic: re-announcing repeats"


@pytest.mark.parametrize("case, reason", [("unsigned", "unsigned"), ("other key", "unknown_signer"),
                                          ("tampered", "bad_signature"), ("key id swapped", "bad_signature")])
def test_what_a_receiver_with_a_pinned_key_refuses(case: str, reason: str) -> None:
    plain = encode_message(sample_update())
    if case == "unsigned":
        payload = plain
    elif case == "other key":
        payload = sealed(SigningKey.generate(), plain)
    elif case == "tampered":
        envelope = COORDINATOR.seal(plain)
        payload = encode_message(envelope.model_copy(update={"payload": plain.replace(b"agent-0", b"agent-9")}))
    else:  # another key's signature under the trusted key's id
        envelope = SigningKey.generate().seal(plain)
        payload = encode_message(envelope.model_copy(update={"key_id": COORDINATOR.public_key.key_id}))
    with pytest.raises(ProtocolError) as failed:
        decode_trusted(payload, type(sample_update()), DEFAULT_LIMITS, TRUSTED)
    assert failed.value.reason.value == reason


def test_an_open_receiver_unwraps_without_verifying() -> None:
    plain = encode_message(sample_update())
    assert decode_trusted(sealed(SigningKey.generate(), plain), type(sample_update()), DEFAULT_LIMITS, OPEN).signer is None
    assert_same_message(decode_trusted(plain, type(sample_update()), DEFAULT_LIMITS, OPEN).message, sample_update())
    with pytest.raises(ValueError):
        Trust(required=True)


def test_chunks_carry_the_signed_envelope_whole() -> None:
    payload = sealed(COORDINATOR, encode_message(sample_update()))
    pieces = split_payload(payload, 512, COORDINATOR, "fl/t/global/f/2")
    assert len(pieces) > 1
    reassembler = Reassembler()
    results = [receive(p, "coordinator", type(sample_update()), reassembler, DEFAULT_LIMITS, TRUSTED, "fl/t/global/f/2")
               for p in pieces]
    assert results[:-1] == [None] * (len(pieces) - 1)
    assert results[-1] is not None and results[-1].signer == "coordinator" and results[-1].size == len(payload)


def test_keys_round_trip_through_files_and_text(tmp_path: Path) -> None:
    key = load_or_create_signing_key(tmp_path / "k.pem")
    assert (tmp_path / "k.pem").stat().st_mode & 0o777 == 0o600
    assert load_or_create_signing_key(tmp_path / "k.pem").public_key == key.public_key
    (tmp_path / "k.pub").write_text(key.public_key.to_text() + "\n")
    assert PublicKey.load(tmp_path / "k.pub") == PublicKey.load(key.public_key.to_text()) == key.public_key
    with pytest.raises(ValueError, match="ed25519"):
        PublicKey.load("not-a-key")


def test_one_sender_cannot_take_every_reassembly_slot() -> None:
    reassembler = Reassembler(max_transfers=8, max_transfers_per_source=2, max_bytes_per_source=4096)
    first = [split_payload(bytes(2000) + bytes([i]), 600)[0] for i in range(3)]
    from protocol.messages import Chunk
    from protocol.wire import decode_message

    chunks = [decode_message(p, Chunk) for p in first]
    assert reassembler.add("honest", chunks[2]) is None
    for chunk in chunks:  # a third transfer of mallory's evicts its own first, never another sender's
        assert reassembler.add("mallory", chunk) is None
    assert reassembler.in_flight == 3
    assert reassembler.in_flight_of("mallory") == 2 and reassembler.in_flight_of("honest") == 1
    with pytest.raises(ProtocolError) as failed:
        reassembler.add("big", decode_message(split_payload(bytes(9000), 600)[0], Chunk))
    assert failed.value.reason.value == "too_large"


@pytest.mark.parametrize("case, reason", [
    ("unsigned", "unsigned"), ("other key", "unknown_signer"), ("other channel", "bad_signature"),
    ("data changed", "bad_signature"), ("header changed", "bad_signature"), ("another trusted owner", "bad_signature")])
def test_a_chunk_is_taken_for_what_its_signature_proves(case: str, reason: str) -> None:
    """Before it is held: a forged chunk takes no transfer slot (nor evicts a genuine transfer), a genuine chunk replayed
    onto another topic (another round's, another agent's) does not verify, and an enrolled agent cannot sign chunks
    for another agent's topic."""
    from protocol.messages import Chunk
    from protocol.transport.chunking import chunk_statement
    from protocol.wire import decode_message

    other = SigningKey.generate()
    lookup = {COORDINATOR.public_key.key_id: ("coordinator", COORDINATOR.public_key),
              other.public_key.key_id: ("agent-b", other.public_key)}
    trust = Trust(lookup.get, required=True) if case == "another trusted owner" else TRUSTED
    channel = "fl/t/global/f/2"
    signer = other if case in ("other key", "another trusted owner") else COORDINATOR
    piece = decode_message(split_payload(bytes(3000), 1024, signer, channel)[0], Chunk)
    changed = {
        "unsigned": piece.model_copy(update={"key_id": None, "signature": None}),
        "data changed": piece.model_copy(update={"data": b"x" + piece.data[1:]}),
        "header changed": piece.model_copy(update={"count": piece.count + 1}),
    }.get(case, piece)
    reassembler = Reassembler()
    with pytest.raises(ProtocolError) as caught:
        receive(encode_message(changed), "coordinator", type(sample_update()), reassembler, DEFAULT_LIMITS, trust,
                "fl/t/global/f/3" if case == "other channel" else channel)
    assert caught.value.reason.value == reason
    assert reassembler.in_flight == 0
    assert chunk_statement(channel, piece) != chunk_statement("fl/t/global/f/3", piece)
