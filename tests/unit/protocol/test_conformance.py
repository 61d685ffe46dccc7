"""Conformance: the golden vectors read by an independent implementation written from docs/protocol.md alone.

Nothing of the project is imported: payloads are decoded with the plain ``msgpack`` package and an array
decoder written from the page's "array extension" section, messages are validated against the page's field
tables (``spec_tables`` reads them), signatures are verified with ``cryptography``'s Ed25519 directly, and
digests and fingerprints are recomputed with ``hashlib`` from the page's definitions. What this reader
accepts and what it refuses (with the reason) must agree with the sidecars the Python implementation wrote.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .spec_tables import Type, message_tables, tables

GOLDEN = Path(__file__).resolve().parents[3] / "tests" / "golden"
ACCEPTED = sorted(str(p.relative_to(GOLDEN).with_suffix("")) for p in GOLDEN.rglob("*.json")
                  if p.parent.name != "reject")
REJECTED = sorted(p.stem for p in (GOLDEN / "reject").glob("*.json"))

# From the page: "dtype MUST be one of ..." (the array extension), the identifier and digest patterns.
DTYPES = {"<f2", "<f4", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1"}
MAX_NDIM = 8
IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DIGEST = re.compile(r"[0-9a-f]{32}")
DOMAIN = b"edgefl-signed-v1\x00"
CHUNKED_KINDS = {"update", "global_state"}


class Refused(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Arr:
    """An ext type 1 value: its wire dtype, shape and elements."""

    dtype: str
    shape: tuple[int, ...]
    values: np.ndarray


def blake2b16(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def py_shape(shape: tuple[int, ...] | list[int]) -> str:
    """A shape as the page spells it: ``()``, ``(3,)``, ``(3, 2)``."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


# -- decoding ------------------------------------------------------------------------------------
def read_array(code: int, data: bytes) -> Arr:
    if code != 1:
        raise Refused("unknown_extension", f"ext type {code}")
    if len(data) < 3:
        raise Refused("malformed", "array header")
    ndim, dtype_len, pad = data[0], data[1], data[2]
    if ndim > MAX_NDIM:
        raise Refused("bad_shape", f"{ndim} dimensions")
    if pad > 15:
        raise Refused("malformed", f"pad {pad}")
    dims_at = 3 + dtype_len + pad
    if len(data) < dims_at + 8 * ndim:
        raise Refused("malformed", "array header does not fit")
    dtype = data[3:3 + dtype_len].decode("ascii", errors="replace")
    if dtype not in DTYPES:
        raise Refused("bad_dtype", dtype)
    shape = struct.unpack_from(f"<{ndim}Q", data, dims_at)
    body = data[dims_at + 8 * ndim:]
    if len(body) != math.prod(shape) * int(dtype[2]):
        raise Refused("malformed", "array data length")
    values = np.frombuffer(body, dtype=np.dtype(dtype)).reshape(shape)
    if dtype[1] == "f" and not np.isfinite(values).all():
        raise Refused("non_finite", "float array")
    return Arr(dtype, tuple(shape), values)


def _pairs(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if not isinstance(key, str):
            raise Refused("malformed", "a map key that is not a string")
        if key in out:
            raise Refused("malformed", f"key {key!r} repeats")
        out[key] = value
    return out


def unpack(payload: bytes) -> Any:
    """One msgpack value, nothing after it."""
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=read_array,
                                object_pairs_hook=_pairs, use_list=True)
    except Refused:
        raise
    except (ValueError, msgpack.UnpackException, UnicodeDecodeError) as exc:  # ExtraData: trailing bytes
        raise Refused("malformed", str(exc)) from None
    _no_timestamps(value)
    return value


def _no_timestamps(value: Any) -> None:
    """msgpack-python reads ext type -1 (timestamps) itself, without the ext hook: refuse them here."""
    if isinstance(value, msgpack.Timestamp):
        raise Refused("unknown_extension", "ext type -1 (timestamp)")
    for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        _no_timestamps(item)


# -- validating against the page's tables --------------------------------------------------------
def check_value(value: Any, alternatives: tuple[Type, ...], where: str) -> None:
    for t in alternatives:
        if _fits(value, t):
            _check_inner(value, t, where)
            return
    raise Refused("schema", f"{where}: {type(value).__name__} is not {[t.base for t in alternatives]}")


def _fits(value: Any, t: Type) -> bool:
    match t.base:
        case "int":
            return type(value) is int
        case "float":
            return type(value) in (float, int)
        case "str":
            return type(value) is str
        case "bin":
            return type(value) is bytes
        case "bool":
            return type(value) is bool
        case "nil":
            return value is None
        case "ext 1":
            return isinstance(value, Arr)
        case "map":
            return type(value) is dict
        case "array":
            return type(value) is list
    raise AssertionError(t)


def _check_inner(value: Any, t: Type, where: str) -> None:
    if t.base == "float" and not math.isfinite(value):
        raise Refused("non_finite", where)
    if t.base == "map" and t.model is not None:
        check_fields(value, t.model, where)
    elif t.base == "map" and t.of is not None:
        for key, item in value.items():
            check_value(item, t.of, f"{where}.{key}")
    elif t.base == "array" and t.of is not None:
        for i, item in enumerate(value):
            check_value(item, t.of, f"{where}[{i}]")


def check_fields(value: dict[str, Any], model: str, where: str) -> None:
    table = tables()[model]
    known = {f.name for f in table.fields}
    unknown = set(value) - known
    if unknown:
        raise Refused("schema", f"{where}: unknown fields {sorted(unknown)}")
    for spec in table.fields:
        if spec.name not in value:
            if spec.required:
                raise Refused("schema", f"{where}: {spec.name} is missing")
            continue
        item = value[spec.name]
        check_value(item, spec.types, f"{where}.{spec.name}")
        head = re.split(r"[;,]", spec.constraints, maxsplit=1)[0].strip()
        if type(item) is str and head == "id" and not IDENTIFIER.fullmatch(item):
            raise Refused("schema", f"{where}.{spec.name}: not an identifier")
        if type(item) is str and head == "digest" and not DIGEST.fullmatch(item):
            raise Refused("schema", f"{where}.{spec.name}: not a digest")


def read_message(payload: bytes, expect: set[str]) -> dict[str, Any]:
    """A message of one of the ``expect`` kinds, checked in the page's order: map, ``v``, ``kind``, body."""
    message = unpack(payload)
    if type(message) is not dict:
        raise Refused("schema", "top level is not a map")
    if type(message.get("v")) is not int or message["v"] != 1:
        raise Refused("unsupported_version", repr(message.get("v")))
    by_kind = message_tables()
    kind = message.get("kind")
    if type(kind) is not str or kind not in by_kind:
        raise Refused("schema", f"kind {kind!r}")
    if kind not in expect:
        raise Refused("wrong_kind", kind)
    check_fields(message, by_kind[kind].model, kind)
    if kind == "global_state":
        digest = global_state_digest(message)
        if digest != message["digest"]:
            raise Refused("digest_mismatch", f"{digest} != {message['digest']}")
    if kind == "chunk" and message["index"] >= message["count"]:
        raise Refused("schema", "chunk index outside count")
    return message


# -- the page's formulas -------------------------------------------------------------------------
def public_key(text: str) -> tuple[str, Ed25519PublicKey]:
    """(key_id, key) from ``ed25519:<base64 of the 32 raw bytes>``."""
    assert text.startswith("ed25519:")
    raw = base64.b64decode(text[len("ed25519:"):], validate=True)
    assert len(raw) == 32
    return hashlib.sha256(raw).hexdigest()[:16], Ed25519PublicKey.from_public_bytes(raw)


def open_signed(envelope: dict[str, Any], trusted: dict[str, Ed25519PublicKey]) -> bytes:
    key = trusted.get(envelope["key_id"])
    if key is None:
        raise Refused("unknown_signer", envelope["key_id"])
    if len(envelope["signature"]) != 64:
        raise Refused("schema", "signature length")
    try:
        key.verify(envelope["signature"], DOMAIN + hashlib.sha256(envelope["payload"]).digest())
    except InvalidSignature:
        raise Refused("bad_signature", envelope["key_id"]) from None
    return envelope["payload"]


def receive(payload: bytes, expect: str, trusted: dict[str, Ed25519PublicKey]) -> dict[str, Any]:
    """What a receiver listening for ``expect`` makes of one payload (a chunk is returned as it is)."""
    outer = read_message(payload, {expect, "signed"} | ({"chunk"} if expect in CHUNKED_KINDS else set()))
    if outer["kind"] != "signed":
        return outer
    if not trusted:  # a receiver without keys unwraps unverified
        return read_message(outer["payload"], {expect})
    return read_message(open_signed(outer, trusted), {expect})


def content_preimage(groups: list[tuple[str, dict[str, Arr]]]) -> bytes:
    out = b""
    for group, arrays in groups:
        out += f"[{group}]".encode()
        for name, a in arrays.items():
            out += f"{name}:{a.dtype}:{py_shape(a.shape)};".encode() + a.values.astype(a.dtype, copy=False).tobytes("C")
    return out


def global_state_digest(state: dict[str, Any]) -> str:
    protos = {}
    if state.get("prototypes") is not None:
        protos["prototypes"] = state["prototypes"]
    if state.get("prototype_counts") is not None:
        protos["counts"] = state["prototype_counts"]
    groups = [("weights", state.get("weights", {})), ("control", state.get("control", {})), ("prototypes", protos)]
    return blake2b16(content_preimage(groups))


def layout_preimage(arrays: list[tuple[str, str, list[int] | tuple[int, ...]]]) -> str:
    """(name, dtype, shape) in order."""
    return "".join(f"{name}:{dtype}:{py_shape(shape)};" for name, dtype, shape in arrays)


def fingerprint_of_arrays(arrays: dict[str, Arr]) -> str:
    return blake2b16(layout_preimage([(n, a.dtype, a.shape) for n, a in arrays.items()]).encode())


def unpack_packed(packed: dict[str, Any]) -> np.ndarray:
    dtype, shape = np.dtype(packed["dtype"]), tuple(packed["shape"])
    values = packed["values"].values
    if packed["kind"] == "topk":
        out = np.zeros(math.prod(shape), dtype=dtype)
        out[packed["indices"].values] = values.astype(dtype)
        return out.reshape(shape)
    if packed["kind"] == "int8":
        return (values.astype(dtype) * dtype.type(packed["scale"])).reshape(shape)
    return values.astype(dtype).reshape(shape)


# -- the vectors ---------------------------------------------------------------------------------
def sidecar(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"{name}.json").read_text())


def payload(name: str) -> bytes:
    return (GOLDEN / f"{name}.msgpack").read_bytes()


def as_json(value: Any) -> Any:
    if isinstance(value, Arr):
        return {"ndarray": {"dtype": value.dtype, "shape": list(value.shape),
                            "data": [v.item() for v in value.values.reshape(-1)]}}
    if isinstance(value, bytes):
        return {"bin": value.hex()}
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def topic_kind(topic: str) -> str:
    """The kind a topic carries, by the page's topic table."""
    rest = topic.split("/")[2:]
    table = {("coordinator", "status"): "coordinator_status", ("rounds", "current"): "round", ("task",): "task"}
    if tuple(rest) in table:
        return table[tuple(rest)]
    if rest[0] in ("secagg", "secagg_relay"):  # the stage, last, names the kind
        return f"secagg_{rest[-1]}"
    if rest[0] == "secagg_inbox":
        return "secagg_inbox"
    if rest[0] == "sites" and len(rest) == 3:  # sites/{id}/roster, sites/{id}/resync
        return f"site_{rest[2]}"
    return {"agents": "agent_status", "updates": "update", "global": "global_state", "notices": "notice",
            "sites": "partial"}[rest[0]]


def trusted_keys(side: dict[str, Any]) -> dict[str, Ed25519PublicKey]:
    return dict([public_key(side["public_key"])]) if "public_key" in side else {}


def decoded(name: str) -> dict[str, Any]:
    """A vector's message, opened (and verified) when signed."""
    side = sidecar(name)
    return receive(payload(name), topic_kind(side["topic"]), trusted_keys(side))


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_vector_decodes_validates_and_equals_its_sidecar(name: str) -> None:
    side = sidecar(name)
    expect = topic_kind(side["topic"])
    outer = read_message(payload(name), {expect, "signed", "chunk"})
    assert outer["kind"] == side["kind"] and len(payload(name)) == side["size_bytes"]
    assert as_json(outer) == side["fields"]
    if outer["kind"] == "signed":
        key_id, _ = public_key(side["public_key"])
        assert outer["key_id"] == key_id
        inner = receive(payload(name), expect, trusted_keys(side))
        assert inner["kind"] == expect
        if "inner_file" in side:
            assert outer["payload"] == payload(Path(side["inner_file"]).stem)
        if "inner_fields" in side:
            assert as_json(inner) == side["inner_fields"]


@pytest.mark.parametrize("name", REJECTED)
def test_a_rejected_vector_is_refused_for_its_reason(name: str) -> None:
    side = sidecar(f"reject/{name}")
    with pytest.raises(Refused) as refused:
        receive(payload(f"reject/{name}"), side["expect"], trusted_keys(side))
    assert refused.value.reason == side["reason"], str(refused.value)


def test_signatures_cover_the_domain_tag_and_the_sha256_of_the_payload() -> None:
    side = sidecar("round_signed")
    envelope = unpack(payload("round_signed"))
    signed = DOMAIN + hashlib.sha256(envelope["payload"]).digest()
    assert len(signed) == 49 and signed.hex() == side["signed_data"]["bin"]
    key_id, key = public_key(side["public_key"])
    key.verify(envelope["signature"], signed)
    with pytest.raises(InvalidSignature):  # not over the payload itself
        key.verify(envelope["signature"], envelope["payload"])


def test_the_content_digest_is_blake2b_16_of_the_documented_preimage() -> None:
    state = decoded("global_state")
    groups = [("weights", state["weights"]), ("control", state["control"]), ("prototypes", {})]
    preimage = content_preimage(groups)
    assert preimage.hex() == sidecar("global_state")["digest_preimage"]["bin"]
    assert blake2b16(preimage) == state["digest"]
    assert hashlib.blake2b(preimage).hexdigest()[:32] != state["digest"]  # not truncated BLAKE2b-512
    announced = decoded("round")
    assert announced["states"]["mlp_tiny"] == {"family": "mlp_tiny", "round": state["round"], "digest": state["digest"]}
    assert decoded("update_delta")["base_digest"] == state["digest"]


def test_layout_fingerprints_agree_across_status_round_state_and_card() -> None:
    state, hello = decoded("global_state"), decoded("agent_status")
    fingerprint = fingerprint_of_arrays(state["weights"])
    assert fingerprint == hello["layout"] == decoded("round")["layouts"]["mlp_tiny"]
    assert blake2b16(sidecar("agent_status")["layout_preimage"].encode()) == fingerprint
    pinned = decoded("task_fingerprint_only")["card"]["layouts"]
    assert pinned == {"mlp_tiny": {"fingerprint": fingerprint, "arrays": []}}


def test_the_task_card_describes_each_family_by_arrays_whose_fingerprint_it_names() -> None:
    task, side = decoded("task"), sidecar("task")
    card = task["card"]
    assert set(card["layouts"]) <= set(card["families"]) and card["layouts"]
    for family, layout in card["layouts"].items():
        arrays = [(a["name"], a["dtype"], a["shape"]) for a in layout["arrays"]]
        assert arrays and all(dtype in DTYPES for _, dtype, _ in arrays)
        preimage = layout_preimage(arrays)
        assert preimage == side["layouts"][family]["layout_preimage"]
        assert blake2b16(preimage.encode()) == layout["fingerprint"], family
    assert len(card["classes"]) >= 2 and len(set(card["classes"])) == len(card["classes"])


def test_a_float16_delta_has_another_layout_fingerprint_as_the_notice_says() -> None:
    delta = decoded("update_delta")["delta"]
    half = {n: Arr("<f2", a.shape, a.values.astype("<f2")) if a.dtype[1] == "f" else a for n, a in delta.items()}
    notice = decoded("notice")
    announced = decoded("round")["layouts"]["mlp_tiny"]
    assert notice["reason"] == "task_mismatch" and notice["about"] == "update"
    assert fingerprint_of_arrays(delta) == announced != fingerprint_of_arrays(half)
    assert notice["detail"] == f"delta of layout {fingerprint_of_arrays(half)}, announced {announced}"


@pytest.mark.parametrize("name", ["update_fp16", "update_int8", "update_topk"])
def test_a_packed_delta_unpacks_by_the_documented_rules(name: str) -> None:
    update, side = decoded(name), sidecar(name)
    unpacked = {n: unpack_packed(p) for n, p in update["packed_delta"].items()}
    assert {n: as_json(Arr(a.dtype.str, a.shape, a)) for n, a in unpacked.items()} == side["unpacked"]
    plain = decoded("update_delta")["delta"]
    assert set(unpacked) | set(update["delta"]) == set(plain)
    for n, a in unpacked.items():
        assert a.shape == plain[n].shape and a.dtype.str == plain[n].dtype


def test_the_chunks_reassemble_into_the_signed_state_they_name() -> None:
    names = sorted((n for n in ACCEPTED if n.startswith("chunk_")), key=lambda n: int(n.split("_")[1]))
    chunks = [read_message(payload(n), {"chunk"}) for n in names]
    first = chunks[0]
    assert [c["index"] for c in chunks] == list(range(first["count"]))
    assert all((c["count"], c["total_bytes"], c["digest"]) == (first["count"], first["total_bytes"], first["digest"])
               for c in chunks)
    whole = b"".join(c["data"] for c in chunks)
    assert len(whole) == first["total_bytes"] and blake2b16(whole) == first["digest"]
    assert whole == payload("global_state_signed")
    state = receive(whole, "global_state", trusted_keys(sidecar("global_state_signed")))
    assert as_json(state) == sidecar("global_state")["fields"]
    for n in names:  # each chunk on its own retained topic, ending in its index
        assert sidecar(n)["topic"].endswith(f"/{int(n.split('_')[1])}") and sidecar(n)["retain"]


def test_the_array_extension_is_framed_and_aligned_as_documented() -> None:
    data = payload("global_state")
    at = 0x7D  # the page's worked example: fc.weight in global_state.msgpack
    assert data[at:at + 3] == bytes([0xC7, 0x38, 0x01])
    assert data[at + 3:at + 9] == bytes([2, 3, 10]) + b"<f4"
    assert data[at + 9 + 10:at + 9 + 10 + 16] == struct.pack("<QQ", 3, 2)
    assert (at + 9 + 10 + 16) % 16 == 0
    assert struct.unpack_from("<2f", data, at + 35) == (0.5, -0.25)
