"""The golden wire vectors (tests/golden/, made by scripts/make_golden_vectors.py) against the codec.

Each vector decodes into the fields its sidecar lists and encodes back to the same bytes; a plain
msgpack library reading arrays by the layout docs/protocol.md gives decodes them too; the rejected
ones fail for the reason their sidecar names; and running the script again writes identical files,
so a change to the wire format changes a vector and has to be made on purpose.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol.codec import decode
from protocol.compression import unpack_arrays
from protocol.errors import ProtocolError
from protocol.limits import DEFAULT_LIMITS
from protocol.messages import MESSAGE_TYPES, Chunk, GlobalState, Signed, Update
from protocol.security.signing import DOMAIN, PublicKey, single_key
from protocol.security.trust import OPEN, Trust, decode_trusted
from protocol.topics import Topics
from protocol.transport.chunking import Reassembler, chunk_statement, receive, split_payload
from protocol.wire import decode_message, encode_message

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden"
SCRIPT = ROOT / "scripts" / "make_golden_vectors.py"
MAX_VECTOR_BYTES = 20 * 1024

ACCEPTED = sorted(p.stem for p in GOLDEN.glob("*.json"))
REJECTED = sorted(p.stem for p in (GOLDEN / "reject").glob("*.json"))
FRESHNESS = sorted(p.stem for p in (GOLDEN / "freshness").glob("*.json"))
TOPIC_KIND = {"coordinator_status": "coordinator_status", "agent_status": "agent_status", "round": "round",
              "global_state": "global_state", "update": "update", "task": "task", "notice": "notice",
              "partial": "partial", "secagg_advertise": "secagg", "secagg_shares": "secagg", "secagg_masked": "secagg",
              "secagg_reveal": "secagg", "secagg_keys": "secagg_relay", "secagg_unmask": "secagg_relay",
              "secagg_inbox": "secagg_inbox", "site_roster": "site_roster", "site_resync": "site_resync"}
NOT_RETAINED = {"update", "notice", "partial", "site_roster", "site_resync", *(k for k in TOPIC_KIND if k.startswith("secagg"))}


def sidecar(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def payload(name: str) -> bytes:
    return (GOLDEN / f"{name}.msgpack").read_bytes()


def jsonable(value: Any) -> Any:
    """Decoded values in the sidecars' notation (arrays and byte strings spelled out)."""
    if isinstance(value, np.ndarray):
        return {"ndarray": {"dtype": value.dtype.str, "shape": list(value.shape),
                            "data": [v.item() for v in value.reshape(-1)]}}
    if isinstance(value, bytes):
        return {"bin": value.hex()}
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def test_every_message_kind_has_a_vector_and_each_is_small() -> None:
    kinds = {sidecar(name)["kind"] for name in ACCEPTED}
    assert kinds == set(MESSAGE_TYPES), f"kinds without a vector: {set(MESSAGE_TYPES) - kinds}"
    packed_kinds = {p["kind"] for name in ACCEPTED for p in sidecar(name)["fields"].get("packed_delta", {}).values()}
    assert packed_kinds == {"fp16", "int8", "topk"}
    assert len(REJECTED) >= 10
    for path in GOLDEN.rglob("*.msgpack"):
        assert path.stat().st_size < MAX_VECTOR_BYTES, path


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_vector_decodes_to_its_fields_and_encodes_back_to_the_same_bytes(name: str) -> None:
    data, side = payload(name), sidecar(name)
    assert len(data) == side["size_bytes"]
    message = decode_message(data)
    assert type(message).model_fields["kind"].default == side["kind"]
    assert jsonable(message.model_dump(mode="python")) == side["fields"]
    assert encode_message(message) == data


def carried_kind(side: dict[str, Any]) -> str:
    """The kind of message a vector carries: envelopes (signed, chunk) travel on their content's topic."""
    if side["kind"] == "signed":
        return carried_kind(sidecar(Path(side["inner_file"]).stem))
    if side["kind"] == "chunk":
        return carried_kind(sidecar(Path(side["whole_file"]).stem))
    return side["kind"]


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_vector_travels_on_the_topic_of_the_message_it_carries(name: str) -> None:
    side = sidecar(name)
    kind = carried_kind(side)
    assert Topics("greenhouse").parse(side["topic"]).kind == TOPIC_KIND[kind]
    assert side["qos"] == 1 and side["retain"] == (kind not in NOT_RETAINED)


def _ndarray_by_the_spec(code: int, data: bytes) -> np.ndarray:
    """The array extension as docs/protocol.md describes it, read without the project's reader."""
    assert code == 1, f"unknown extension type {code}"
    ndim, dtype_len, pad = data[0], data[1], data[2]
    dtype = data[3:3 + dtype_len].decode("ascii")
    assert data[3 + dtype_len:3 + dtype_len + pad] == b"\0" * pad
    dims_at = 3 + dtype_len + pad
    shape = struct.unpack_from(f"<{ndim}Q", data, dims_at)
    body = data[dims_at + 8 * ndim:]
    assert len(body) == int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(body, dtype=dtype).reshape(shape)


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_plain_msgpack_library_reads_a_vector_by_the_documented_layout(name: str) -> None:
    decoded = msgpack.unpackb(payload(name), raw=False, strict_map_key=True,
                              ext_hook=lambda code, data: _ndarray_by_the_spec(code, data))
    assert jsonable(decoded) == sidecar(name)["fields"]


@pytest.mark.parametrize("name", ACCEPTED)
def test_array_data_starts_16_byte_aligned_from_the_start_of_the_payload(name: str) -> None:
    data = payload(name)
    base = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
    arrays: list[np.ndarray] = []

    def walk(value: Any) -> None:
        if isinstance(value, np.ndarray):
            arrays.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(decode(data))
    for array in arrays:
        assert (array.__array_interface__["data"][0] - base) % 16 == 0


def test_digest_and_layout_fingerprint_are_blake2b_of_the_documented_preimages() -> None:
    state = sidecar("global_state")
    preimage = bytes.fromhex(state["digest_preimage"]["bin"])
    assert hashlib.blake2b(preimage, digest_size=16).hexdigest() == state["fields"]["digest"]
    assert preimage.startswith(b"[weights]fc.weight:<f4:(3, 2);")
    assert b"fc.bias:<f4:(3,);" in preimage and b"bn.num_batches_tracked:<i8:();" in preimage
    assert preimage.endswith(b"[control][prototypes]")
    hello = sidecar("agent_status")
    fingerprint = hashlib.blake2b(hello["layout_preimage"].encode(), digest_size=16).hexdigest()
    assert fingerprint == hello["fields"]["layout"] == sidecar("round")["fields"]["layouts"]["mlp_tiny"]


def _unpack_by_the_spec(packed: dict[str, Any]) -> np.ndarray:
    """fp16 / int8 / topk decoding as docs/protocol.md states it, from the sidecar's fields."""
    def array(field: str) -> np.ndarray:
        spec = packed[field]["ndarray"]
        return np.array(spec["data"], dtype=spec["dtype"]).reshape(spec["shape"])

    dtype, shape = np.dtype(packed["dtype"]), tuple(packed["shape"])
    if packed["kind"] == "topk":
        out = np.zeros(int(np.prod(shape)), dtype=dtype)
        out[array("indices")] = array("values")
        return out.reshape(shape)
    values = array("values").astype(dtype)
    return (values * dtype.type(packed["scale"]) if packed["kind"] == "int8" else values).reshape(shape)


@pytest.mark.parametrize("name", ["update_fp16", "update_int8", "update_topk"])
def test_a_packed_delta_unpacks_to_the_dense_arrays_its_sidecar_lists(name: str) -> None:
    side = sidecar(name)
    message = decode_message(payload(name), Update)
    assert jsonable(unpack_arrays(message.packed_delta)) == side["unpacked"]
    by_spec = {n: _unpack_by_the_spec(p) for n, p in side["fields"]["packed_delta"].items()}
    assert jsonable(by_spec) == side["unpacked"]
    assert set(message.packed_delta) | set(message.delta) == set(decode_message(payload("update_delta"), Update).delta)


def test_a_round_naming_an_unknown_algorithm_and_compressor_decodes() -> None:
    """Algorithm and compressor are open sets: what a receiver does not implement it declines later."""
    from protocol.compression import COMPRESSORS, CompressionSpec, kind_of
    from protocol.messages import RoundAnnouncement

    message = decode_message(payload("round_unknown_names"), RoundAnnouncement)
    assert message.algorithm == "fedfuture" and message.compression == "zstd:3"
    assert kind_of(message.compression) not in COMPRESSORS
    with pytest.raises(ValueError, match="unknown compression"):
        CompressionSpec.parse(message.compression)  # what an agent would apply: declined, not decoded wrongly


@pytest.mark.parametrize("name", ["round_signed", "global_state_signed", "task_signed", "notice_signed"])
def test_a_signed_vector_verifies_with_the_published_test_key(name: str) -> None:
    side = sidecar(name)
    envelope = decode_message(payload(name), Signed)
    key = PublicKey.from_text(side["public_key"])
    assert envelope.key_id == key.key_id == hashlib.sha256(key.raw).hexdigest()[:16]
    assert envelope.payload == payload(Path(side["inner_file"]).stem)
    signed_data = DOMAIN + hashlib.sha256(envelope.payload).digest()
    if "signed_data" in side:
        assert signed_data == bytes.fromhex(side["signed_data"]["bin"])
    Ed25519PublicKey.from_public_bytes(key.raw).verify(envelope.signature, signed_data)  # raises if not
    inner = type(decode_message(envelope.payload))
    received = decode_trusted(payload(name), inner, DEFAULT_LIMITS, Trust(single_key("coordinator", key), True))
    assert received.signer == "coordinator"


def test_the_chunks_reassemble_into_the_signed_global_state() -> None:
    names = sorted(n for n in ACCEPTED if n.startswith("chunk_"))
    whole = payload("global_state_signed")
    chunks = [decode_message(payload(n), Chunk) for n in names]
    assert [c.index for c in chunks] == list(range(chunks[0].count)) and len(chunks) == chunks[0].count >= 2
    reassembler = Reassembler()
    results = [reassembler.add("coordinator", chunk) for chunk in chunks]
    assert results[:-1] == [None] * (len(chunks) - 1) and results[-1] == whole
    again = Reassembler()  # and through the receive path the agent uses, signature checked
    key = PublicKey.from_text(sidecar("global_state_signed")["public_key"])
    trust = Trust(single_key("coordinator", key), True)
    channel = sidecar(names[0])["channel"]
    got = [receive(payload(n), "coordinator", GlobalState, again, DEFAULT_LIMITS, trust, channel) for n in names]
    assert got[-1] is not None and encode_message(got[-1].message) == payload("global_state")
    for name, chunk in zip(names, chunks, strict=True):  # what each signature covers, byte for byte
        assert chunk_statement(channel, chunk).hex() == sidecar(name)["statement_hex"]
    # The script splits exactly as protocol.transport.chunking does, but with a fixed transfer id (so the signatures
    # differ: they cover it).
    reference = [decode_message(p, Chunk) for p in split_payload(whole, sidecar(names[0])["max_message_bytes"])]
    unsigned = {"key_id": None, "signature": None}
    assert [c.model_copy(update={"transfer_id": chunks[0].transfer_id}) for c in reference] == \
        [c.model_copy(update=unsigned) for c in chunks]


def _agent_outcome(state: dict[str, Any], message: dict[str, Any]) -> tuple[str, str | None]:
    """The agent's freshness rule as docs/protocol.md states it (Freshness), from plain fields."""
    if message["epoch"] < state["epoch"]:
        return "drop", "stale_epoch"
    if message["epoch"] > state["epoch"]:
        return "follow", None
    ends_run = message["kind"] == "coordinator_status" and message["state"] != "online"
    return ("drop", "inconsistent") if ends_run and message["run_id"] != state["run_id"] else ("accept", None)


def _coordinator_outcome(mark: dict[str, Any] | None, status: dict[str, Any]) -> tuple[str, str | None]:
    """The coordinator's rule for agent statuses as docs/protocol.md states it (Freshness)."""
    if mark is None or status["epoch"] > mark["epoch"] or status["epoch"] == 0:
        return "accept", None
    if status["epoch"] < mark["epoch"]:
        return "drop", "stale_status"
    will_newest = mark["will_after"] == mark["seq"]
    if status["seq"] == 0:
        fresh = mark["will_after"] is None or will_newest
    else:
        fresh = status["seq"] > mark["seq"] or (status["seq"] == mark["seq"] and not will_newest)
    return ("accept", None) if fresh else ("drop", "stale_status")


@pytest.mark.parametrize("name", FRESHNESS)
def test_a_freshness_vector_decodes_verifies_and_meets_the_documented_rule(name: str) -> None:
    side = sidecar(f"freshness/{name}")
    data = payload(f"freshness/{name}")
    message = decode_message(data)
    assert jsonable(message.model_dump(mode="python")) == side["fields"] and encode_message(message) == data
    if isinstance(message, Signed):  # genuine: verifies with the run's key, yet may be dropped
        key = PublicKey.from_text(side["public_key"])
        inner = type(decode_message(message.payload))
        message = decode_trusted(data, inner, DEFAULT_LIMITS, Trust(single_key("coordinator", key), True)).message
        assert jsonable(message.model_dump(mode="python")) == side["inner_fields"]
    fields = message.model_dump()
    judge = _agent_outcome if side["receiver"] == "agent" else _coordinator_outcome
    assert side["cases"]
    for case in side["cases"]:
        assert judge(case["state"], fields) == (case["outcome"], case["reason"]), case


@pytest.mark.parametrize("name", REJECTED)
def test_a_rejected_vector_fails_for_the_reason_its_sidecar_names(name: str) -> None:
    side = sidecar(f"reject/{name}")
    expect = MESSAGE_TYPES[side["expect"]]
    trust = Trust(single_key("coordinator", PublicKey.from_text(side["public_key"])), True) \
        if "public_key" in side else OPEN
    with pytest.raises(ProtocolError) as caught:
        decode_trusted(payload(f"reject/{name}"), expect, DEFAULT_LIMITS, trust)
    assert caught.value.reason.value == side["reason"], caught.value.detail


def test_running_the_script_again_writes_identical_files(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    stored = sorted(p.relative_to(GOLDEN) for p in GOLDEN.rglob("*") if p.is_file() and p.name != ".gitattributes")
    assert written == stored
    changed = [str(p) for p in written if (tmp_path / p).read_bytes() != (GOLDEN / p).read_bytes()]
    assert not changed, f"regenerated vectors differ: {changed}; a wire change must update tests/golden on purpose"
