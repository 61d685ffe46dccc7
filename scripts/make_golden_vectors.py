"""Write the golden wire vectors (tests/golden/): encoded messages with JSON sidecars.

Each vector is one MQTT payload exactly as it travels (``NAME.msgpack``) and a sidecar
(``NAME.json``) with its topic, retain flag, and the fields a decoder must produce. Arrays
appear in sidecars as ``{"ndarray": {"dtype", "shape", "data"}}`` (data flattened in C order),
byte strings as ``{"bin": "<hex>"}``. ``reject/`` holds payloads a receiver must refuse, each
with the reason it is refused for. docs/protocol.md describes the format.

Deterministic (fixed keys, seeds, timestamps and transfer ids): running it again writes the
same bytes, which tests/unit/protocol/test_golden_vectors.py checks, so a wire change shows
up as a changed vector and has to be made on purpose.

    python scripts/make_golden_vectors.py [--out tests/golden]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from golden_inputs import (  # scripts/, beside this file
    AGENT,
    AGENT_EPOCH,
    CHUNK_MAX_MESSAGE_BYTES,
    COORDINATOR_SEED,
    DIGITS_LAYOUTS,
    EPOCH,
    FAMILY,
    FEDERATION,
    INT8_SEED,
    OLD_EPOCH,
    OLD_RUN_ID,
    RUN_ID,
    SESSION,
    SITE,
    SITE_SEED,
    TASK,
    TIMESTAMP,
    TOPICS,
    TRANSFER_ID,
    Vectors,
    coordinator_key,
    digest_preimage,
    fields_of,
    jsonable,
    layout_preimage,
    model_delta,
    model_weights,
    py_tuple,
)
from golden_secagg import secure_vectors

from protocol.arrays import layout_of
from protocol.codec import encode
from protocol.compression import pack_arrays, unpack
from protocol.digest import digest_bytes
from protocol.messages import (
    AgentStatus,
    Chunk,
    CoordinatorStatus,
    GlobalState,
    LocalTraining,
    Message,
    Notice,
    RoundAnnouncement,
    StateRef,
    TaskAnnouncement,
    TrainMetrics,
    Update,
)
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.security.signing import DOMAIN, SigningKey
from protocol.site_rosters import SiteResync, SiteRoster
from protocol.task_card import FamilyLayout, TaskCard
from protocol.tasks import BUILTIN_CARDS, layout_fingerprint
from protocol.transport.chunking import CHUNK_OVERHEAD_BYTES, chunk_statement
from protocol.wire import encode_message

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "golden"

def build() -> dict[str, tuple[bytes, dict[str, Any]]]:
    """Every vector, accepted ones first, then ``reject/...``."""
    v = Vectors()
    key = coordinator_key()
    weights, delta = model_weights(), model_delta()
    layout = layout_fingerprint(layout_of(weights))
    layout_note = {"layout_preimage": layout_preimage(weights)}

    status = CoordinatorStatus(federation=FEDERATION, run_id=RUN_ID, session=SESSION, state="online", round=3,
                               algorithm="fedprox", version="0.1.0", timestamp=TIMESTAMP, epoch=EPOCH)
    v.message("coordinator_status", status, TOPICS.coordinator_status, True,
              "The coordinator's retained status (sent signed in a real run; see round_signed).")

    hello = AgentStatus(agent_id=AGENT, state="online", device="rpi", family=FAMILY, num_samples=120,
                        num_eval_samples=40, version="0.1.0", timestamp=TIMESTAMP, session="a1b2c3d4e5f6",
                        task_ref=TASK, layout=layout, label_counts=np.array([50, 40, 30], dtype="<i8"),
                        epoch=AGENT_EPOCH, seq=7)
    v.message("agent_status", hello, TOPICS.agent_status(AGENT), True,
              "An agent's retained hello/heartbeat, with its label counts (sum = num_samples).", **layout_note)

    state = GlobalState(run_id=RUN_ID, family=FAMILY, round=2, weights=weights,
                        digest=GlobalState.compute_digest(weights, {}, None, None), epoch=EPOCH)
    preimage = digest_preimage([("weights", weights), ("control", {}), ("prototypes", {})])
    state_bytes = v.message("global_state", state, TOPICS.global_state(FAMILY, 2), True,
                            "A family's global state with three arrays (float32 2-D and 1-D, int64 0-d).",
                            digest_preimage={"bin": preimage.hex()})

    announcement = RoundAnnouncement(
        run_id=RUN_ID, round=3, task="train", task_ref=TASK, layouts={FAMILY: layout}, algorithm="fedprox",
        training=LocalTraining(epochs=1, learning_rate=0.05, batch_size=32), params={"mu": 0.01},
        selected=[AGENT, "agent-2"], states={FAMILY: StateRef(family=FAMILY, round=2, digest=state.digest)},
        init_seed=42, issued_at=TIMESTAMP, deadline_s=60.0, last_round=10, compression="topk:0.5", epoch=EPOCH)
    round_bytes = v.message("round", announcement, TOPICS.rounds_current, True,
                            "Round 3 of a FedProx run: trains from global_state, compresses with topk:0.5.")

    sealed = key.seal(round_bytes)
    v.message("round_signed", sealed, TOPICS.rounds_current, True,
              "round.msgpack in a Signed envelope made with the test coordinator key.",
              public_key=key.public_key.to_text(), private_seed_hex=COORDINATOR_SEED.hex(),
              inner_file="round.msgpack", signed_data={"bin": (DOMAIN + hashlib.sha256(round_bytes).digest()).hex()})

    future = announcement.model_copy(update={"round": 4, "algorithm": "fedfuture", "params": {"horizon": 3},
                                             "compression": "zstd:3"})
    v.message("round_unknown_names", RoundAnnouncement.model_validate(future.model_dump()), TOPICS.rounds_current, True,
              "A round of an algorithm (fedfuture) and a compressor (zstd:3) this version does not implement: "
              "names are open sets, so a receiver decodes it and declines with a reason, it does not refuse it.")

    metrics = TrainMetrics(eval_loss=0.5, eval_accuracy=0.75, num_eval_samples=40, train_loss=0.25,
                           train_accuracy=0.875, duration_s=1.5, steps=4, extra={"grad_norm": 0.125})
    common = dict(run_id=RUN_ID, agent_id=AGENT, round=3, task="train", task_ref=TASK, family=FAMILY,
                  base_digest=state.digest, num_samples=120, metrics=metrics)
    topic = TOPICS.update(AGENT, 3)
    v.message("update_delta", Update(**common, delta=delta), topic, False, "An uncompressed delta update.")
    floats = {n: a for n, a in delta.items() if a.dtype.kind == "f"}
    rest = {n: a for n, a in delta.items() if n not in floats}
    for spec in ("fp16", "int8", "topk:0.5"):
        packed = pack_arrays(floats, spec, np.random.default_rng(INT8_SEED))  # the seed drives int8's rounding
        v.message("update_" + spec.split(":")[0], Update(**common, delta=rest, packed_delta=packed), topic, False,
                  f"The delta compressed with {spec}: float arrays in packed_delta, the int64 counter in delta.",
                  compression=spec, unpacked={n: jsonable(unpack(p)) for n, p in packed.items()})

    signed_state = encode_message(key.seal(state_bytes))
    v.add("global_state_signed", signed_state, TOPICS.global_state(FAMILY, 2), True,
          "global_state.msgpack in a Signed envelope; chunk_*.msgpack carry exactly these bytes.",
          fields_of(key.seal(state_bytes)), public_key=key.public_key.to_text(), inner_file="global_state.msgpack")
    assert len(signed_state) > CHUNK_MAX_MESSAGE_BYTES, "split_payload only splits what does not fit"
    piece = CHUNK_MAX_MESSAGE_BYTES - CHUNK_OVERHEAD_BYTES
    count = math.ceil(len(signed_state) / piece)
    for index in range(count):
        chunk = Chunk(transfer_id=TRANSFER_ID, index=index, count=count, total_bytes=len(signed_state),
                      digest=digest_bytes(signed_state), data=signed_state[index * piece:(index + 1) * piece])
        channel = TOPICS.global_state(FAMILY, 2)
        statement = chunk_statement(channel, chunk)
        chunk = chunk.model_copy(update={"key_id": key.public_key.key_id, "signature": key.sign(statement)})
        v.message(f"chunk_{index}", chunk, TOPICS.global_state_chunk(FAMILY, 2, index), True,
                  f"Piece {index} of global_state_signed.msgpack split at max_message_bytes "
                  f"{CHUNK_MAX_MESSAGE_BYTES} ({piece} data bytes a chunk), signed by the coordinator for {channel}.",
                  max_message_bytes=CHUNK_MAX_MESSAGE_BYTES, whole_file="global_state_signed.msgpack",
                  channel=channel, public_key=key.public_key.to_text(), statement_hex=statement.hex())

    _task_and_notice(v, key, layout, delta)
    _partial(v, state.digest, delta)
    _site_roster(v, hello, key)
    secure_vectors(v, TOPICS, RUN_ID, AGENT, FAMILY)
    _freshness(v, status, state, announcement, hello, key)
    _rejects(v, status, state, round_bytes, key)
    return v.items


def _task_and_notice(v: Vectors, key: SigningKey, layout: str, delta: dict[str, np.ndarray]) -> None:
    """The run's task card (retained on ``task``) and a refusal notice (on ``notices/{agent_id}``), plain and signed."""
    card = BUILTIN_CARDS["digits"].model_copy(update={"layouts": {
        family: FamilyLayout.of({name: (shape, "<f4") for name, shape in arrays})
        for family, arrays in DIGITS_LAYOUTS.items()}})
    task = TaskAnnouncement(run_id=RUN_ID, card=card, timestamp=TIMESTAMP, epoch=EPOCH)
    layouts = {family: {"layout_preimage": "".join(f"{a.name}:{a.dtype}:{py_tuple(a.shape)};" for a in lay.arrays)}
               for family, lay in card.layouts.items()}
    task_bytes = v.message("task", task, TOPICS.task, True,
                           "The digits task's full card (edge-agent tasks --card digits) as a coordinator given it publishes "
                           "it before round 1: label space, families, and each family's layout (arrays in "
                           "order, and their fingerprint).",
                           layouts=layouts)
    v.message("task_signed", key.seal(task_bytes), TOPICS.task, True, "task.msgpack in a Signed envelope, as it travels.",
              public_key=key.public_key.to_text(), inner_file="task.msgpack")
    golden = TaskCard(name=TASK.name, version=TASK.version, classes=("a", "b", "c"), families=(FAMILY, "cnn_small"),
                      layouts={FAMILY: FamilyLayout(fingerprint=layout)})
    v.message("task_fingerprint_only", TaskAnnouncement(run_id=RUN_ID, card=golden, timestamp=TIMESTAMP, epoch=EPOCH),
              TOPICS.task, True,
              "An operator's card that declared no layouts: mlp_tiny's was fixed by a majority of its agents (its "
              "fingerprint, no arrays), cnn_small's is not fixed yet (absent).")
    half = {n: a.astype("<f2") if a.dtype.kind == "f" else a for n, a in delta.items()}
    notice = Notice(run_id=RUN_ID, agent_id=AGENT, about="update", reason="task_mismatch",
                    detail=f"delta of layout {layout_fingerprint(layout_of(half))}, announced {layout}", round=3,
                    timestamp=TIMESTAMP, epoch=EPOCH)
    notice_bytes = v.message("notice", notice, TOPICS.notices(AGENT), False,
                             "The notice an agent gets for a round-3 update whose delta is float16 (the layout names "
                             "float32): refused as task_mismatch, by its layout fingerprint.")
    v.message("notice_signed", key.seal(notice_bytes), TOPICS.notices(AGENT), False,
              "notice.msgpack in a Signed envelope, as it travels (QoS 1, not retained).",
              public_key=key.public_key.to_text(), inner_file="notice.msgpack")


def _partial(v: Vectors, base_digest: str, delta: dict[str, np.ndarray]) -> None:
    """A site aggregator's partial aggregate of round 3 (two agents folded, one straggling), plain and signed."""
    weights = {AGENT: 120.0, "agent-2": 40.0}
    other = {n: a * np.asarray(0.5, a.dtype) for n, a in delta.items() if a.dtype.kind == "f"}
    sums = {n: weights[AGENT] * a.astype("<f8") + weights["agent-2"] * other[n].astype("<f8")
            for n, a in delta.items() if a.dtype.kind == "f"}
    outcomes = {AGENT: AgentOutcome(outcome="accepted", samples=120, weight=120.0, eval_accuracy=0.75, eval_loss=0.5,
                                    num_eval_samples=40),
                "agent-2": AgentOutcome(outcome="accepted", samples=40, weight=40.0),
                "agent-3": AgentOutcome(outcome="rejected", reason="stale_base"),
                "agent-4": AgentOutcome(outcome="straggler")}
    partial = PartialAggregate(run_id=RUN_ID, epoch=EPOCH, site_id=SITE, round=3, family=FAMILY,
                               base_digest=base_digest, sums=sums,
                               integers={n: a for n, a in delta.items() if a.dtype.kind != "f"}, heaviest=AGENT,
                               total_weight=160.0, count=2, outcomes=outcomes, bytes_in=2048)
    partial_bytes = v.message("partial", partial, TOPICS.partial(SITE, 3), False,
                              "A site's partial aggregate of round 3: float64 sums of weight x delta over two agents "
                              "(the mean is sums / total_weight), the heaviest agent's int64 counter, every "
                              "selected agent's outcome.")
    control = {n: s * np.asarray(-0.25, s.dtype) for n, s in sums.items()}
    v.message("partial_scaffold", partial.model_copy(update={"control_sums": control}), TOPICS.partial(SITE, 3),
              False, "partial.msgpack in a SCAFFOLD round: control_sums (float64 weight x control delta) beside sums.")
    proto_sums = np.zeros((3, 4), "<f8")
    proto_sums[0], proto_sums[2] = 120 * 0.5, 40 * -0.25  # class 0: 120 samples at 0.5; class 2: 40 at -0.25
    fedproto = partial.model_copy(update={"sums": {}, "integers": {}, "heaviest": None, "prototype_sums": proto_sums,
                                          "prototype_counts": np.array([120, 0, 40], "<i8")})
    v.message("partial_fedproto", fedproto, TOPICS.partial(SITE, 3), False,
              "partial.msgpack in a FedProto round: per class, float64 sums of count x prototype and the int64 counts "
              "(3 classes, 4 dimensions; class 1 held by none), and no sums.")
    site_key = SigningKey(Ed25519PrivateKey.from_private_bytes(SITE_SEED))
    v.message("partial_signed", site_key.seal(partial_bytes), TOPICS.partial(SITE, 3), False,
              "partial.msgpack in a Signed envelope made with the test site key (enrolled at the root like an agent).",
              public_key=site_key.public_key.to_text(), inner_file="partial.msgpack")


def _site_roster(v: Vectors, hello: AgentStatus, key: SigningKey) -> None:
    """A site's roster (one changed status, who it heard, one agent gone) signed by the site; the root's resync
    request signed by the coordinator."""
    roster = SiteRoster(site_id=SITE, started_at=1767225600.0, seq=7, statuses=[hello], present=[AGENT, "agent-2"],
                        gone=["agent-9"])
    roster_bytes = v.message("site_roster", roster, TOPICS.site_roster(SITE), False,
                             "A site's roster: the one status that changed since its last roster (as the agent sent "
                             "it), the agents it heard from since its last present list, and one it forgot.")
    site_key = SigningKey(Ed25519PrivateKey.from_private_bytes(SITE_SEED))
    v.message("site_roster_signed", site_key.seal(roster_bytes), TOPICS.site_roster(SITE), False,
              "site_roster.msgpack in a Signed envelope made with the test site key.",
              public_key=site_key.public_key.to_text(), inner_file="site_roster.msgpack")
    resync = SiteResync(site_id=SITE, issued_at=1767225660.0, agents=["agent-2"])
    resync_bytes = v.message("site_resync", resync, TOPICS.site_resync(SITE), False,
                             "The root asks the site to resend agent-2's status (it does not know it).")
    v.message("site_resync_signed", key.seal(resync_bytes), TOPICS.site_resync(SITE), False,
              "site_resync.msgpack in a Signed envelope made with the test coordinator key.",
              public_key=key.public_key.to_text(), inner_file="site_resync.msgpack")


def _freshness(v: Vectors, status: CoordinatorStatus, state: GlobalState, announcement: RoundAnnouncement,
               hello: AgentStatus, key: SigningKey) -> None:
    """Messages that decode and verify, but that a receiver in a given state acts on or drops (docs/protocol.md,
    Freshness). Sidecars: ``receiver`` and ``cases``, each the receiver's state, the ``outcome`` (accept, follow
    a newer epoch, drop) and the reason counted for a drop."""
    agent_in_run = {"epoch": EPOCH, "run_id": RUN_ID}

    def coordinator_message(name: str, message: Message, topic: str, description: str,
                            cases: list[dict[str, Any]]) -> None:
        plain = encode_message(message)
        v.add(f"freshness/{name}", encode_message(key.seal(plain)), topic, True, description,
              fields_of(key.seal(plain)), inner_fields=fields_of(message), public_key=key.public_key.to_text(),
              receiver="agent", cases=cases)

    old = {"run_id": OLD_RUN_ID, "epoch": OLD_EPOCH}
    coordinator_message(
        "finished_of_an_older_epoch", status.model_copy(update={**old, "state": "finished", "round": 5}),
        TOPICS.coordinator_status, "An earlier run's genuine 'finished' status, published again during this run.",
        [{"state": agent_in_run, "outcome": "drop", "reason": "stale_epoch"},
         {"state": {"epoch": OLD_EPOCH, "run_id": OLD_RUN_ID}, "outcome": "accept", "reason": None}])
    coordinator_message(
        "round_of_an_older_epoch", announcement.model_copy(update={**old, "round": 5, "issued_at": TIMESTAMP + 30}),
        TOPICS.rounds_current, "An earlier run's last announcement (still within its deadline), published again.",
        [{"state": agent_in_run, "outcome": "drop", "reason": "stale_epoch"}])
    coordinator_message(
        "global_state_of_an_older_epoch", state.model_copy(update={**old, "round": 4}), TOPICS.global_state(FAMILY, 4),
        "An earlier run's global state for a round this run has not reached (same digest: the epoch is not in it).",
        [{"state": agent_in_run, "outcome": "drop", "reason": "stale_epoch"}])
    coordinator_message(
        "round_of_a_newer_epoch", announcement.model_copy(update={"run_id": "5eed5eed5eed", "epoch": EPOCH + 3_600_000,
                                                                  "round": 1}),
        TOPICS.rounds_current, "A new run of the same coordinator key: agents follow it.",
        [{"state": agent_in_run, "outcome": "follow", "reason": None}])
    mark = {"epoch": AGENT_EPOCH, "seq": 7, "will_after": None}
    v.message("freshness/agent_status_of_an_older_process",
              hello.model_copy(update={"epoch": AGENT_EPOCH - 3_600_000, "seq": 412}), TOPICS.agent_status(AGENT), True,
              "The agent's status from its previous process (sent signed in a real run), published again.",
              receiver="coordinator", cases=[{"state": mark, "outcome": "drop", "reason": "stale_status"}])
    v.message("freshness/agent_status_older_seq", hello.model_copy(update={"seq": 6}), TOPICS.agent_status(AGENT), True,
              "The status before agent_status (same process, seq 6), published again.",
              receiver="coordinator", cases=[{"state": mark, "outcome": "drop", "reason": "stale_status"},
                                             {"state": None, "outcome": "accept", "reason": None}])
    will = hello.model_copy(update={"state": "offline", "seq": 0})
    v.message("freshness/agent_will", will, TOPICS.agent_status(AGENT), True,
              "The agent's last will (seq 0): taken once per process, stale once a status of that process followed it.",
              receiver="coordinator", cases=[
                  {"state": mark, "outcome": "accept", "reason": None},
                  {"state": {"epoch": AGENT_EPOCH, "seq": 7, "will_after": 7}, "outcome": "accept", "reason": None},
                  {"state": {"epoch": AGENT_EPOCH, "seq": 8, "will_after": 7}, "outcome": "drop",
                   "reason": "stale_status"}])


def _rejects(v: Vectors, status: CoordinatorStatus, state: GlobalState, round_bytes: bytes, key: SigningKey) -> None:
    """Payloads a receiver must refuse, each built from a valid one by changing as little as possible."""
    good = encode_message(status)
    fields = status.model_dump()

    topics = {"coordinator_status": TOPICS.coordinator_status, "global_state": TOPICS.global_state(FAMILY, 2),
              "round": TOPICS.rounds_current}

    def reject(name: str, payload: bytes, reason: str, why: str, expect: str = "coordinator_status",
               **extra: Any) -> None:
        """``expect``: the kind of message the receiver listens for on the topic."""
        v.add(f"reject/{name}", payload, topics[expect], True, why, None, expect=expect, reason=reason, **extra)

    reject("version_2", encode({**fields, "v": 2}), "unsupported_version", "v is 2; this schema is version 1.")
    reject("version_true", encode({**fields, "v": True}), "unsupported_version",
           "v is the boolean true: the version is the integer 1, nothing that compares equal to it.")
    reject("version_float", encode({**fields, "v": 1.0}), "unsupported_version", "v is the float 1.0.")
    items = list(fields.items())
    repeated = encode(dict(items[:1]))[1:]  # the first key and value once more, after the others
    reject("repeated_key", bytes([good[0] + 1]) + good[1:] + repeated, "malformed",
           "The first key appears twice: readers disagree on which copy wins, so none is accepted.")
    reject("unknown_field", encode({**fields, "colour": "red"}), "schema", "A field the model does not declare.")
    reject("unknown_kind", encode({**fields, "kind": "gossip"}), "schema", "A kind no model has.")
    reject("string_for_int", encode({**fields, "round": "3"}), "schema", "round as a string: no coercion.")
    reject("trailing_bytes", good + b"\xc0", "malformed", "A nil after the message: the payload must be one value.")
    float64 = b"\xcb" + struct.pack(">d", status.timestamp)
    assert good.count(float64) == 1
    reject("timestamp_ext", good.replace(float64, b"\xd6\xff" + (1767225600).to_bytes(4, "big")), "unknown_extension",
           "timestamp as a msgpack timestamp (ext type -1) instead of a float64.")
    reject("nan_float", encode({**fields, "timestamp": float("nan")}), "non_finite", "A NaN scalar field.")
    state_bytes = encode_message(state)
    big_endian = state_bytes.replace(b"<f4", b">f4", 1)
    reject("big_endian_dtype", big_endian, "bad_dtype", "An array whose dtype string is '>f4' (big-endian).",
           expect="global_state")
    nan_weights = {**state.weights, "fc.bias": np.array([0.25, np.nan, 0.75], dtype="<f4")}
    reject("nan_in_array", encode({**state.model_dump(), "weights": nan_weights}), "non_finite",
           "A float array holding NaN.", expect="global_state")
    tampered = {**state.weights, "fc.bias": np.array([0.25, -0.5, 0.5], dtype="<f4")}
    reject("digest_mismatch", encode({**state.model_dump(), "weights": tampered}), "digest_mismatch",
           "fc.bias changed after the digest was taken.", expect="global_state")
    changed = round_bytes[:-1] + bytes([round_bytes[-1] ^ 1])  # compression "topk:0.5" becomes "topk:0.4"
    forged = encode_message(key.seal(round_bytes).model_copy(update={"payload": changed}))
    reject("bad_signature", forged, "bad_signature",
           "round_signed.msgpack with the last byte of its payload changed (still a valid round); "
           "verify with the test coordinator key.",
           expect="round", public_key=key.public_key.to_text())


def to_json(value: Any, indent: str = "") -> str:
    """JSON with one key a line, but lists of scalars (array data, shapes) on one line."""
    inner = indent + " "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + to_json(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value)


def write(items: dict[str, tuple[bytes, dict[str, Any]]], out: Path) -> None:
    for name, (payload, sidecar) in items.items():
        path = out / f"{name}.msgpack"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
        path.with_suffix(".json").write_text(to_json(sidecar) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory to write into (default: %(default)s)")
    args = parser.parse_args(argv)
    items = build()
    write(items, args.out)
    print(f"wrote {len(items)} vectors to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
