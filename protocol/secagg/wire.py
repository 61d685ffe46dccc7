"""The wire form of a SecAgg+ round: what the round announcement declares, and one signed message per stage.

Agents publish on ``secagg/{agent_id}/{round}/{stage}`` (stage: advertise, shares, masked, reveal);
the coordinator relays on ``secagg_relay/{family}/{round}/{stage}`` (keys, unmask) to a family's
roster and on ``secagg_inbox/{agent_id}/{round}`` the share bundles addressed to one agent. A module
on :mod:`protocol.fields` and :mod:`protocol.arrays` only, so that :mod:`protocol.messages` lists
these among its message types without an import cycle (docs/protocol.md, "Secure aggregation").
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from protocol.arrays import Array
from protocol.fields import MAX_AGENTS_PER_ROUND, Identifier, Message, NonNegativeInt, Round
from protocol.secagg.prg import PrgName
from protocol.secagg.ring import RING_BITS, ring_bits
from protocol.wire_model import WireModel

Key = Annotated[bytes, Field(min_length=32, max_length=32)]
"""An X25519 public key, a 32-byte seed or a SHA-256 commitment."""
Bundle = Annotated[bytes, Field(min_length=1, max_length=256)]
"""An AEAD-sealed share bundle (``protocol.secagg.messages.BUNDLE_BYTES``), opaque to the coordinator."""
MAX_DEGREE = 1024



class SecureFamily(WireModel):
    """One family's SecAgg+ session of a round (``protocol.secagg.config.RoundConfig``)."""

    roster: list[Identifier] = Field(min_length=2, max_length=MAX_AGENTS_PER_ROUND)
    """The selected agents of this family, sorted: an agent's position here is its Shamir x - 1."""
    graph_seed: Key
    degree: int = Field(ge=1, le=MAX_DEGREE)
    threshold: int = Field(ge=1, le=MAX_DEGREE)
    n_params: int = Field(ge=2, le=1 << 31)
    """Ring elements per masked input: the family's floating values (then its control variates' under
    SCAFFOLD), then the weight."""
    weight_cap: int = Field(ge=1)
    """Samples one agent counts for at most: it masks weight = min(samples, cap) / cap."""
    ring_bits: int = Field(default=32, ge=2, le=32)
    """The masked input's ring is Z_2^ring_bits: each element travels in this many bits (``protocol.secagg.ring``)."""

    @model_validator(mode="after")
    def _check(self) -> SecureFamily:
        if self.roster != sorted(set(self.roster)):
            raise PydanticCustomError("schema", "a secure roster must be sorted and unique")
        if self.threshold > self.degree:
            raise PydanticCustomError("schema", "threshold above the degree")
        return self


class SecureNoise(WireModel):
    """Distributed DP (``SecureSetup.noise``): each agent bounds its delta's L2 norm by ``clip_norm`` before weighing
    it, then adds noise of standard deviation noise_multiplier x clip_norm / sqrt(shares) to every value, so that
    the sum of any ``shares`` survivors carries noise_multiplier x clip_norm (docs/privacy.md). ``gaussian``: drawn
    in floating point before quantising; ``skellam``: integer noise (a difference of two Poisson draws) of that
    standard deviation in grid steps, added after quantising, so that the ring sum carries Skellam noise exactly and
    the rounding is part of the accounted sensitivity (Agarwal, Kairouz and Liu, 2021)."""

    noise_multiplier: float = Field(gt=0.0, le=1000.0)
    clip_norm: float = Field(gt=0.0, le=1e6)
    shares: int = Field(ge=1, le=MAX_DEGREE)
    """The fewest survivors a family's sum may have (its threshold): the noise is split this many ways."""
    mechanism: Literal["gaussian", "skellam"] = "gaussian"

    @property
    def agent_std(self) -> float:
        """Standard deviation of the noise one agent adds to each value."""
        return float(self.noise_multiplier * self.clip_norm / self.shares ** 0.5)


class SiteSessions(WireModel):
    """In ``SecureSetup.sites``: the sessions a site aggregator serves for its own agents (docs/deploying-sites.md).
    Its agents' stages stay on the site's broker; the site relays for them, signed with ``key``, and sends the root
    one partial per session with the unmasked sum (``PartialAggregate.secure``): per family, or under FedProto one
    session across its agents' families (the same ``SecureFamily`` under each name), sent under the first name."""

    key: Key | None = None
    """The site aggregator's Ed25519 public key, enrolled at the root: agents take its relays signed by it alone
    (None: a run without enrollment, whose messages are unsigned)."""
    families: dict[Identifier, SecureFamily] = Field(min_length=1, max_length=64)


class SecureSetup(WireModel):
    """In ``RoundAnnouncement.secure``: the round is securely aggregated; stage deadlines are seconds
    after ``issued_at`` (the masked inputs are due by ``deadline_s``, the reveals ``unmask_s`` later)."""

    prg: PrgName = "chacha20"
    clip: float = Field(gt=0.0, le=1e6)
    """Every value of an agent's delta is clipped on the device to [-clip, clip] before quantising."""
    advertise_s: float = Field(gt=0.0)
    share_s: float = Field(gt=0.0)
    unmask_s: float = Field(gt=0.0)
    families: dict[Identifier, SecureFamily] = Field(max_length=64)
    levels: int = Field(default=0, ge=0, le=(1 << 31) - 1)
    """The grid: one value quantises to an integer in [-levels, levels] (127: int8, 2047: fp16; under Skellam noise
    as fine as its sampler allows), rounding stochastically; 0: the finest the ring of 2^32 allows, rounding to
    the nearest (then every family's ring has 32 bits)."""
    control_clip: float | None = Field(default=None, gt=0.0, le=1e6)
    """SCAFFOLD: every value of an agent's control-variate delta (gradient units, not weight units) is clipped
    on the device to [-control_clip, control_clip] and masked after its delta; None: no control delta is masked."""
    noise: SecureNoise | None = None
    """Distributed DP: the noise each agent adds before masking; None: none (device-side DP-SGD is separate)."""
    sites: dict[Identifier, SiteSessions] = Field(default_factory=dict, max_length=1024)
    """Site id -> the sessions its site aggregator serves (agents behind a site's bridged broker); omitted when empty."""

    def sessions(self) -> list[tuple[str | None, str, SecureFamily]]:
        """Every (site or None for the root's own, family, session) of the round."""
        return [(None, f, s) for f, s in self.families.items()] + [
            (site, f, s) for site, held in self.sites.items() for f, s in held.families.items()]

    @model_serializer(mode="wrap")
    def _without_empty_sites(self, handler: SerializerFunctionWrapHandler) -> dict:
        out = handler(self)
        if not self.sites:  # a round without sites reads as it did before sites could hold sessions
            out.pop("sites", None)
        return out

    @model_validator(mode="after")
    def _rings(self) -> SecureSetup:
        for _, _, family in self.sessions():
            needed = ring_bits(self.levels, len(family.roster)) if self.levels else RING_BITS
            if not needed <= family.ring_bits <= (RING_BITS if self.levels else needed):
                raise PydanticCustomError("schema", "a secure family's ring_bits cannot hold its roster's sum exactly")
        return self


class AdvertisedKeys(WireModel):
    agent_id: Identifier
    encryption_key: Key
    mask_key: Key
    commitment: Key
    """SHA-256 of the round context and the agent's self-mask seed."""


class SecureAdvertise(Message):
    """Stage 1, agent -> coordinator on ``secagg/{agent_id}/{round}/advertise``."""

    kind: Literal["secagg_advertise"] = "secagg_advertise"
    run_id: Identifier
    round: Round
    family: Identifier
    keys: AdvertisedKeys


class SecureKeys(Message):
    """Stage 1 closed, coordinator -> roster on ``secagg_relay/{family}/{round}/keys``: every advertisement taken."""

    kind: Literal["secagg_keys"] = "secagg_keys"
    run_id: Identifier
    round: Round
    family: Identifier
    advertised: list[AdvertisedKeys] = Field(max_length=MAX_AGENTS_PER_ROUND)


class SecureShares(Message):
    """Stage 2, agent -> coordinator on ``secagg/{agent_id}/{round}/shares``: one sealed bundle per neighbour."""

    kind: Literal["secagg_shares"] = "secagg_shares"
    run_id: Identifier
    round: Round
    agent_id: Identifier
    bundles: dict[Identifier, Bundle] = Field(max_length=MAX_DEGREE)
    """Recipient -> bundle."""


class SecureInbox(Message):
    """Stage 2 closed, coordinator -> one agent on ``secagg_inbox/{agent_id}/{round}``: the bundles sealed for it."""

    kind: Literal["secagg_inbox"] = "secagg_inbox"
    run_id: Identifier
    round: Round
    agent_id: Identifier
    bundles: dict[Identifier, Bundle] = Field(max_length=MAX_DEGREE)
    """Sender -> bundle."""


class SecureMasked(Message):
    """Stage 3, agent -> coordinator on ``secagg/{agent_id}/{round}/masked``. The masked input is
    n_params elements of ring_bits bits packed in uint32 words (``protocol.secagg.ring.pack``:
    uint32[n_params] for a ring of 2^32); the metrics (of the model the round started from) travel in the clear."""

    kind: Literal["secagg_masked"] = "secagg_masked"
    run_id: Identifier
    round: Round
    agent_id: Identifier
    masked: Array
    eval_loss: float | None = Field(default=None, ge=0.0)
    eval_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    num_eval_samples: NonNegativeInt = 0
    train_loss: float | None = Field(default=None, ge=0.0)


class SecureUnmask(Message):
    """Stage 3 closed, coordinator -> roster on ``secagg_relay/{family}/{round}/unmask``: whose input is in the sum."""

    kind: Literal["secagg_unmask"] = "secagg_unmask"
    run_id: Identifier
    round: Round
    family: Identifier
    survivors: list[Identifier] = Field(max_length=MAX_AGENTS_PER_ROUND)


class SecureReveal(Message):
    """Stage 4, agent -> coordinator on ``secagg/{agent_id}/{round}/reveal``: Shamir shares (uint32[11]),
    of survivors' self-mask seeds and of dropped neighbours' mask keys, never both for one agent."""

    kind: Literal["secagg_reveal"] = "secagg_reveal"
    run_id: Identifier
    round: Round
    agent_id: Identifier
    self_mask_shares: dict[Identifier, Array] = Field(max_length=MAX_DEGREE)
    key_shares: dict[Identifier, Array] = Field(max_length=MAX_DEGREE)

    @model_validator(mode="after")
    def _disjoint(self) -> SecureReveal:
        if self.self_mask_shares.keys() & self.key_shares.keys():
            raise PydanticCustomError("schema", "both shares revealed for one agent")
        return self


STAGE_MESSAGES: dict[str, type[Message]] = {
    "advertise": SecureAdvertise, "shares": SecureShares, "masked": SecureMasked, "reveal": SecureReveal,
    "keys": SecureKeys, "inbox": SecureInbox, "unmask": SecureUnmask,
}
"""Topic stage -> the model it carries."""
