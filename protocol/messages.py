"""Pydantic models of every message on the wire.

All models are strict (no silent coercion), frozen, reject unknown fields, and carry the
schema version ``v`` and a ``kind`` that names the model. Floats must be finite.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, StringConstraints, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from protocol.agent_status import AgentStatus, PrivacySpent  # noqa: F401  (re-exported: their historical home)
from protocol.arrays import Array, Arrays
from protocol.compression import Compression, PackedArray
from protocol.digest import digest_arrays
from protocol.fields import (  # noqa: F401  (re-exported: the field types' historical home)
    IDENTIFIER_PATTERN,
    MAX_AGENTS_PER_ROUND,
    MAX_CLASSES,
    VERSION_PATTERN,
    Digest,
    Epoch,
    Identifier,
    Message,
    NonNegativeInt,
    Probability,
    Round,
    TaskRef,
    TaskVersion,
)
from protocol.partials import PartialAggregate
from protocol.secagg.wire import (
    SecureAdvertise,
    SecureInbox,
    SecureKeys,
    SecureMasked,
    SecureReveal,
    SecureSetup,
    SecureShares,
    SecureUnmask,
)
from protocol.site_rosters import SiteResync, SiteRoster
from protocol.task_card import TaskCard
from protocol.wire_model import WireModel

Algorithm = Identifier
"""A federated algorithm's name: an open set (``coordinator.strategies.registry.ALGORITHMS`` on the
coordinator, ``edge_agent.algorithms.registry.CLIENT_ALGORITHMS`` on agents), so an agent decodes a
round of an algorithm it does not implement and declines it (``AgentStatus.problem``) instead of
dropping the announcement as a schema error."""
Task = Literal["train", "evaluate"]
"""What a round asks of the agents it selects (not to be confused with the user's ``TaskRef``)."""


class CoordinatorStatus(Message):
    kind: Literal["coordinator_status"] = "coordinator_status"
    federation: Identifier
    run_id: Identifier
    session: Identifier
    """New on every coordinator start, and whenever the broker lost the coordinator's persistent
    session: updates sent under an earlier session may never have reached it, so agents that
    answered the open round send their update again when they see a new one."""
    state: Literal["online", "offline", "finished"]
    round: Round
    algorithm: Algorithm
    version: str = Field(max_length=64)
    timestamp: float
    epoch: Epoch = 0
    """The run's epoch: higher for every new run, kept by a resumed one; agents drop what an older epoch signed."""


class StateRef(WireModel):
    """Which global state a family starts a round from (its topic is global/{family}/{round})."""

    family: Identifier
    round: Round
    digest: Digest


class LocalTraining(WireModel):
    epochs: int = Field(ge=1, le=1000)
    learning_rate: float = Field(gt=0.0, le=10.0)
    momentum: float = Field(default=0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    batch_size: int | None = Field(default=None, ge=1, le=65536)
    """None: the device profile's batch size."""
    steps: int | None = Field(default=None, ge=1, le=1_000_000)
    """None: ``epochs`` passes over the data. Set: exactly this many mini-batch steps (reshuffled passes, the
    last cut short) whatever the agent's data size, so every agent takes the same number (SCAFFOLD's premise)."""


class RoundAnnouncement(Message):
    kind: Literal["round"] = "round"
    run_id: Identifier
    round: Round
    task: Task
    task_ref: TaskRef
    """The user's task this run trains; agents of another task or version refuse the round."""
    layouts: dict[Identifier, Digest] = Field(default_factory=dict, max_length=64)
    """Layout fingerprint per model family, once known: an agent whose model differs refuses the round,
    and the coordinator aggregates no payload of another layout."""
    algorithm: Algorithm
    training: LocalTraining
    params: dict[Annotated[str, StringConstraints(max_length=64)], float | int | bool] = Field(
        default_factory=dict, max_length=64
    )
    """Algorithm hyper-parameters (e.g. FedProx ``mu``); each algorithm validates its own."""
    selected: list[Identifier] = Field(max_length=MAX_AGENTS_PER_ROUND)
    states: dict[Identifier, StateRef] = Field(default_factory=dict, max_length=64)
    """Global state per model family; a family absent here bootstraps from its seeded init."""
    init_seed: int = Field(ge=0, lt=2**31)
    issued_at: float
    deadline_s: float = Field(gt=0.0)
    """Seconds after ``issued_at``; relative so that skewed device clocks still agree."""
    last_round: Round
    compression: Compression = "none"
    """How agents compress their delta's float arrays (``protocol.compression.CompressionSpec`` text).
    An open set of kinds: one this agent does not know decodes, and it answers uncompressed, saying
    why in ``Update.compression_declined``."""
    epoch: Epoch = 0
    """The run's epoch (as in ``CoordinatorStatus``)."""
    secure: SecureSetup | None = None
    """Set when the round is securely aggregated (SecAgg+): agents answer through its stages, not ``Update``."""
    claim_cap: int | None = Field(default=None, ge=1, le=2**31)
    """The most samples an update counts for at the root, for an agent without an enrolled cap (a multiple of
    the median claim of the round's selected agents); None: no such cap. A site aggregator caps its agents at
    no more, since the root cannot re-weigh a site's sum."""
    control_layouts: dict[Identifier, Digest] = Field(default_factory=dict, max_length=64)
    """SCAFFOLD: the layout fingerprint of each family's server control variate (its parameters), for families
    with a state. A site aggregator, which holds no state, checks agents' control deltas against it. Omitted
    when empty."""

    @model_serializer(mode="wrap")
    def _without_empty_control_layouts(self, handler: SerializerFunctionWrapHandler) -> dict:
        """Off the wire unless SCAFFOLD sets it: other algorithms' announcements are byte for byte as before."""
        out = handler(self)
        if not self.control_layouts:
            out.pop("control_layouts", None)
        return out

    @model_validator(mode="after")
    def _refs_match_families(self) -> RoundAnnouncement:
        for family, ref in self.states.items():
            if ref.family != family:
                raise PydanticCustomError("schema", "state ref for {f} names {g}", {"f": family, "g": ref.family})
        if len(set(self.selected)) != len(self.selected):
            raise PydanticCustomError("schema", "selected agents repeat")
        if not self.control_layouts.keys() <= self.states.keys():
            raise PydanticCustomError("schema", "control layouts of families without a state")
        return self


class GlobalState(Message):
    """The global state of one model family for one round, retained on global/{family}/{round}."""

    kind: Literal["global_state"] = "global_state"
    run_id: Identifier
    family: Identifier
    round: Round
    digest: Digest
    weights: Arrays = Field(default_factory=dict, max_length=4096)
    control: Arrays = Field(default_factory=dict, max_length=4096)
    """SCAFFOLD's server control variate, parameters only."""
    prototypes: Array | None = None
    """FedProto global prototypes, shape [classes, dim]; rows with zero count are unused."""
    prototype_counts: Array | None = None
    epoch: Epoch = 0
    """The run's epoch (as in ``CoordinatorStatus``); not part of the digest, which covers the arrays only."""

    @staticmethod
    def compute_digest(
        weights: Arrays, control: Arrays, prototypes: np.ndarray | None, counts: np.ndarray | None
    ) -> str:
        protos = {} if prototypes is None else {"prototypes": prototypes}
        if counts is not None:
            protos["counts"] = counts
        return digest_arrays([("weights", weights), ("control", control), ("prototypes", protos)])

    @model_validator(mode="after")
    def _check(self) -> GlobalState:
        _check_prototypes(self.prototypes, self.prototype_counts)
        actual = self.compute_digest(self.weights, self.control, self.prototypes, self.prototype_counts)
        if actual != self.digest:
            raise PydanticCustomError("digest_mismatch", "content digest {a} differs from {d}",
                                      {"a": actual, "d": self.digest})
        return self


class TrainMetrics(WireModel):
    """Reported by an agent; ``eval_*`` score the model the round started from on its held-out split:
    the global model it received (FedProto: its own personal model)."""

    eval_loss: float | None = Field(default=None, ge=0.0)
    eval_accuracy: Probability | None = None
    num_eval_samples: NonNegativeInt = 0
    train_loss: float | None = Field(default=None, ge=0.0)
    train_accuracy: Probability | None = None
    duration_s: float = Field(default=0.0, ge=0.0)
    steps: NonNegativeInt = 0
    extra: dict[Annotated[str, StringConstraints(max_length=64)], float] = Field(default_factory=dict, max_length=64)


class Update(Message):
    """An agent's answer to one round.

    Exactly one payload shape per task: ``delta`` (local minus global weights) in a normal
    training round, ``weights`` when the family had no global state yet (bootstrap), neither
    for evaluation or FedProto, which sends only ``prototypes`` with ``prototype_counts``.
    SCAFFOLD adds ``control_delta`` (named like the parameters) to its delta or weights.
    """

    kind: Literal["update"] = "update"
    run_id: Identifier
    agent_id: Identifier
    round: Round
    task: Task
    task_ref: TaskRef
    family: Identifier
    base_digest: Digest | None
    """Digest of the global state trained from; None when bootstrapping."""
    num_samples: NonNegativeInt
    weights: Arrays = Field(default_factory=dict, max_length=4096)
    delta: Arrays = Field(default_factory=dict, max_length=4096)
    control_delta: Arrays = Field(default_factory=dict, max_length=4096)
    packed_delta: dict[str, PackedArray] = Field(default_factory=dict, max_length=4096)
    """The delta's float arrays, compressed as the round asked; integer arrays stay in ``delta``."""
    packed_control_delta: dict[str, PackedArray] = Field(default_factory=dict, max_length=4096)
    """SCAFFOLD's control delta, compressed like ``packed_delta`` (never in a bootstrap round)."""
    compression_declined: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = None
    """Why the delta travels uncompressed although the round asked for compression (this agent
    does not use that compressor, or could not apply it); None otherwise."""
    prototypes: Array | None = None
    prototype_counts: Array | None = None
    metrics: TrainMetrics
    privacy: PrivacySpent | None = None

    @model_validator(mode="after")
    def _check(self) -> Update:
        if self.weights and self.delta:
            raise PydanticCustomError("schema", "an update carries weights or a delta, not both")
        if (self.packed_delta or self.packed_control_delta) and self.weights:
            raise PydanticCustomError("schema", "weights travel uncompressed")
        if self.packed_delta.keys() & self.delta.keys() or self.packed_control_delta.keys() & self.control_delta.keys():
            raise PydanticCustomError("schema", "an array travels packed or plain, not both")
        if self.compression_declined is not None and (self.packed_delta or not self.delta):
            raise PydanticCustomError("schema", "compression_declined travels with an uncompressed delta")
        model_payload = bool(self.weights or self.delta or self.packed_delta)
        control = bool(self.control_delta or self.packed_control_delta)
        if self.task == "evaluate" and (model_payload or control or self.prototypes is not None):
            raise PydanticCustomError("schema", "an evaluation answer carries no model payload")
        _check_prototypes(self.prototypes, self.prototype_counts)
        if self.prototypes is not None and (model_payload or control):
            raise PydanticCustomError("schema", "a prototype update carries no weights, delta or control delta")
        if control and not model_payload:
            raise PydanticCustomError("schema", "a control delta travels with the weights or delta it belongs to")
        return self


class TaskAnnouncement(Message):
    """The run's task card, signed and retained on ``task``, published before round 1 and again whenever a
    family's layout is fixed: what an agent must train, and with which arrays, to be selected."""

    kind: Literal["task"] = "task"
    run_id: Identifier
    card: TaskCard
    timestamp: float
    epoch: Epoch = 0
    """The run's epoch (as in ``CoordinatorStatus``)."""


NoticeReason = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]


class Notice(Message):
    """Why the coordinator refused one agent's status or update: signed, on ``notices/{agent_id}``, not retained,
    at most one per agent and reason per interval (``notice_interval_s``)."""

    kind: Literal["notice"] = "notice"
    run_id: Identifier
    agent_id: Identifier
    about: Literal["status", "update"]
    reason: NoticeReason
    """A reject reason (docs/protocol.md lists them), e.g. ``task_mismatch``, ``late``, ``duplicate_agent_id``."""
    detail: str = Field(default="", max_length=512)
    round: Round = 0
    """The update's round; 0 for a status."""
    timestamp: float
    epoch: Epoch = 0
    """The run's epoch (as in ``CoordinatorStatus``)."""


class Chunk(Message):
    """One piece of a message too large for the broker's message size cap."""

    kind: Literal["chunk"] = "chunk"
    transfer_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,32}$")]
    index: NonNegativeInt
    count: int = Field(ge=1, le=100_000)
    total_bytes: int = Field(ge=1)
    digest: Digest
    data: bytes
    key_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")] | None = None
    signature: Annotated[bytes, Field(min_length=64, max_length=64)] | None = None
    """The sender's Ed25519 signature over this chunk on its channel (``protocol.transport.chunking.chunk_statement``):
    a chunk is taken for what its signature proves before it is held, so forged chunks cannot take a receiver's
    transfer slots; omitted when the sender has no key."""

    @model_serializer(mode="wrap")
    def _without_absent_signature(self, handler: SerializerFunctionWrapHandler) -> dict:
        out = handler(self)
        if self.signature is None:  # an unsigned chunk reads as it did before chunks could be signed
            out.pop("key_id", None)
            out.pop("signature", None)
        return out

    @model_validator(mode="after")
    def _check(self) -> Chunk:
        if (self.key_id is None) != (self.signature is None):
            raise PydanticCustomError("schema", "a chunk's key_id and signature travel together")
        if self.index >= self.count:
            raise PydanticCustomError("schema", "chunk index {i} outside count {c}", {"i": self.index, "c": self.count})
        # No split sends an empty piece or more pieces than bytes: such pieces would cost the receiver's byte quotas
        # nothing while each holds an entry.
        if not self.data or self.count > self.total_bytes:
            raise PydanticCustomError("schema", "a chunk carries data, and a transfer has no more pieces than bytes")
        return self


def _check_prototypes(prototypes: np.ndarray | None, counts: np.ndarray | None) -> None:
    if prototypes is None and counts is None:
        return
    if prototypes is None or counts is None:
        raise PydanticCustomError("schema", "prototypes and prototype_counts travel together")
    if prototypes.ndim != 2 or prototypes.dtype.kind != "f":
        raise PydanticCustomError("bad_shape", "prototypes must be a float [classes, dim] array")
    if counts.shape != (prototypes.shape[0],) or counts.dtype.kind not in "iu" or (counts < 0).any():
        raise PydanticCustomError("bad_shape", "prototype_counts must be non-negative integers, one per class")


class Signed(Message):
    """Another message's encoded bytes with its sender's Ed25519 signature (see protocol/security/signing.py).

    Who sent a message is what the signature proves, never its topic: the receiver looks the
    key up by ``key_id`` among the keys it trusts and verifies before it decodes ``payload``.
    """

    kind: Literal["signed"] = "signed"
    key_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
    payload: bytes
    signature: Annotated[bytes, Field(min_length=64, max_length=64)]


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.model_fields["kind"].default: cls
    for cls in (CoordinatorStatus, AgentStatus, RoundAnnouncement, GlobalState, Update, TaskAnnouncement, Notice,
                Chunk, Signed, PartialAggregate, SecureAdvertise, SecureKeys, SecureShares, SecureInbox, SecureMasked,
                SecureUnmask, SecureReveal, SiteRoster, SiteResync)
}
