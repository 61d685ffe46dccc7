"""A site aggregator's partial aggregate of one round and family: what crosses a site's bridge instead of updates.

A site aggregator (``coordinator site``) admits its own agents' updates with the root's admission
code and folds them into exact float64 sums; it publishes one signed ``PartialAggregate`` per family
and round on ``sites/{site_id}/partials/{round}``. For the weighted mean the root adds the sums of
every site (and of any agent that answers it directly) and divides once, so its new state equals
flat FedAvg over the same updates to float64 rounding. ``outcomes`` accounts for every agent of the
site the round selected, so the root's rounds log still counts every device.

A module of its own, on :mod:`protocol.fields` and :mod:`protocol.arrays`, so that
:mod:`protocol.messages` lists it among the message types without an import cycle.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, StringConstraints, model_serializer, model_validator
from pydantic_core import PydanticCustomError

from protocol.arrays import Array, Arrays
from protocol.fields import MAX_AGENTS_PER_ROUND, Digest, Epoch, Identifier, Message, NonNegativeInt, Round
from protocol.wire_model import WireModel

OutcomeReason = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]


class AgentOutcome(WireModel):
    """What became of one selected agent of the site in this round."""

    outcome: Literal["accepted", "rejected", "straggler"]
    reason: OutcomeReason | None = None
    """A reject reason (as in ``Notice.reason``) for ``rejected``; None otherwise."""
    samples: NonNegativeInt = 0
    """``accepted``: the sample count it was counted for (after the site's claim cap)."""
    weight: float = Field(default=0.0, ge=0.0)
    """``accepted``: its share of ``total_weight`` (samples x the policy's weight)."""
    eval_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    eval_loss: float | None = Field(default=None, ge=0.0)
    num_eval_samples: NonNegativeInt = 0
    """The agent's evaluation of the round's starting model, for the root's federated metrics."""

    @model_validator(mode="after")
    def _check(self) -> AgentOutcome:
        if (self.outcome == "rejected") != (self.reason is not None):
            raise PydanticCustomError("schema", "a reason travels with a rejected outcome, and only with one")
        if self.outcome != "accepted" and (self.samples or self.weight):
            raise PydanticCustomError("schema", "only an accepted outcome carries samples and weight")
        return self


class PartialAggregate(Message):
    """One site's fold of one family's accepted deltas for one round (weighted mean only)."""

    kind: Literal["partial"] = "partial"
    run_id: Identifier
    epoch: Epoch = 0
    """The root's run epoch, as the round announcement carried it."""
    site_id: Identifier
    round: Round
    family: Identifier
    base_digest: Digest | None
    """The family's global state every folded delta started from (the announcement's); None in a bootstrap round."""
    sums: Arrays = Field(default_factory=dict, max_length=4096)
    """Per floating array of the delta: sum over accepted agents of weight x delta, float64. Empty when none."""
    integers: Arrays = Field(default_factory=dict, max_length=4096)
    """The delta's integer arrays as the heaviest accepted agent sent them (the mean takes them from the heaviest)."""
    heaviest: Identifier | None = None
    """The agent ``integers`` come from (ties between equal weights go to the smallest id, as in flat FedAvg)."""
    proposal: Arrays = Field(default_factory=dict, max_length=4096)
    """A bootstrap round (the family has no state yet): the first weights the site's accepted agents all sent,
    byte for byte (a strict majority of the site's proposers); the root agrees across sites as across agents."""
    total_weight: float = Field(ge=0.0)
    count: NonNegativeInt
    """Agents folded in with a positive weight."""
    outcomes: dict[Identifier, AgentOutcome] = Field(max_length=MAX_AGENTS_PER_ROUND)
    bytes_in: NonNegativeInt = 0
    """Bytes of updates the site received for it (what did not cross the bridge)."""
    control_sums: Arrays = Field(default_factory=dict, max_length=4096)
    """SCAFFOLD: per parameter, the sum over accepted agents of weight x control delta (float64), beside ``sums``.
    Omitted when empty."""
    proposal_control: Arrays = Field(default_factory=dict, max_length=4096)
    """SCAFFOLD's bootstrap round: the control delta the agreed proposers sent with ``proposal``, byte for byte.
    Omitted when empty."""
    prototype_sums: Array | None = None
    """FedProto: per class, the sum over the site's accepted agents of count x prototype (``<f8`` [classes, dim]; under
    a robust rule, the rule's per-class result x ``prototype_counts``). Omitted when None."""
    prototype_counts: Array | None = None
    """FedProto: per class, the samples behind ``prototype_sums`` (``<i8`` [classes]). Omitted when None."""
    ring_sum: Array | None = None
    """A secure partial (the round's ``SecureSetup.sites`` gave the site sessions): the unmasked ring sum of the site's
    SecAgg+ session of this family (uint32, n_params), which the root reads back as it reads its own sessions' sums.
    The site knows only that total: accepted outcomes carry no weight (0), ``count`` is the session's survivors and
    ``total_weight`` the weight the sum holds; no ``sums``. Omitted when None."""

    @property
    def secure(self) -> bool:
        return self.ring_sum is not None

    @model_serializer(mode="wrap")
    def _without_optional(self, handler: SerializerFunctionWrapHandler) -> dict:
        """Fields a plain FedAvg partial does not use stay off the wire (its bytes are as before they existed)."""
        out = handler(self)
        for name in ("ring_sum", "prototype_sums", "prototype_counts"):
            if getattr(self, name) is None:
                out.pop(name, None)
        for name in ("control_sums", "proposal_control"):
            if not getattr(self, name):
                out.pop(name, None)
        return out

    @model_validator(mode="after")
    def _check(self) -> PartialAggregate:
        accepted = [o for o in self.outcomes.values() if o.outcome == "accepted"]
        prototypes = self.prototype_sums is not None
        if prototypes != (self.prototype_counts is not None):
            raise PydanticCustomError("schema", "prototype_sums and prototype_counts travel together")
        if self.ring_sum is not None:
            if (self.ring_sum.dtype.str != "<u4" or self.ring_sum.ndim != 1 or any(o.weight for o in accepted)
                    or self.count != len(accepted) or self.sums or self.integers or self.proposal
                    or self.control_sums or self.proposal_control or prototypes):
                raise PydanticCustomError("schema", "a secure partial carries a uint32 ring sum only, and counts every "
                                                    "accepted agent, each without a weight")
            return self
        elif self.count != sum(1 for o in accepted if o.weight > 0):
            raise PydanticCustomError("schema", "count {c} differs from the accepted outcomes of positive weight",
                                      {"c": self.count})
        weights = math.fsum(o.weight for o in accepted)
        if not math.isclose(weights, self.total_weight, rel_tol=1e-9, abs_tol=1e-12):
            raise PydanticCustomError("schema", "total_weight {t} is not the accepted outcomes' {w}",
                                      {"t": self.total_weight, "w": weights})
        if self.proposal_control and not self.proposal:
            raise PydanticCustomError("schema", "proposal_control travels with a proposal")
        if self.proposal:
            if self.sums or self.integers or self.control_sums or self.heaviest is not None or \
                    self.base_digest is not None or prototypes:
                raise PydanticCustomError("schema", "a bootstrap proposal travels without sums or a base")
            return self
        if prototypes:
            self._check_prototypes()
            return self
        if self.control_sums and not self.sums:
            raise PydanticCustomError("schema", "control_sums travel beside sums")
        if any(a.dtype.str != "<f8" for a in self.control_sums.values()):
            raise PydanticCustomError("schema", "control sums are float64")
        if (self.count == 0) != (not self.sums):
            raise PydanticCustomError("schema", "sums travel with a positive count, and only with one")
        if any(a.dtype.str != "<f8" for a in self.sums.values()):
            raise PydanticCustomError("schema", "sums are float64")
        if any(a.dtype.kind not in "iub" for a in self.integers.values()) or self.integers.keys() & self.sums.keys():
            raise PydanticCustomError("schema", "integers holds the delta's non-floating arrays only")
        heaviest = self.outcomes.get(self.heaviest) if self.heaviest is not None else None
        if (self.heaviest is None) != (self.count == 0) or (
                heaviest is not None and (heaviest.outcome != "accepted" or heaviest.weight <= 0)):
            raise PydanticCustomError("schema", "heaviest names an accepted agent when the count is positive")
        return self

    def _check_prototypes(self) -> None:
        sums, counts = self.prototype_sums, self.prototype_counts
        assert sums is not None and counts is not None
        if sums.dtype.str != "<f8" or sums.ndim != 2 or counts.dtype.str != "<i8" or counts.shape != sums.shape[:1]:
            raise PydanticCustomError("schema", "prototype sums are <f8 [classes, dim] with <i8 [classes] counts")
        if (counts < 0).any() or ((counts == 0) & (sums != 0).any(axis=1)).any():
            raise PydanticCustomError("schema", "prototype counts are non-negative, and a class counted 0 sums to 0")
        if self.count == 0 or self.sums or self.integers or self.heaviest is not None or self.control_sums:
            raise PydanticCustomError("schema", "prototype sums travel alone, with a positive count")
