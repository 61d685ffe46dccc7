"""The configured aggregator: one rule from coordinator.aggregation, its parameters, and clipping."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.aggregation import NamedArrays, weighted_mean
from coordinator.aggregation.registry import RULES, needs_individual_updates
from coordinator.settings import CoordinatorSettings

AggregateFn = Callable[[Sequence[NamedArrays], Sequence[float]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Aggregator:
    """A rule with its parameters bound: ``aggregator(updates, weights) -> {name: array}``.

    Call it on updates, i.e. deltas from a global state (model deltas, control-variate
    deltas): with ``clip_norm`` set, each is scaled to at most that L2 norm first. Absolute
    values (a bootstrap round's weights, class prototypes) have no meaningful norm to clip;
    combine those with :meth:`unclipped`, the same rule without clipping. Every rule here is
    translation-equivariant, so combining absolute weights robustly equals the seed plus the
    robust combination of their deltas from it.
    """

    name: str
    rule: Callable[..., dict[str, np.ndarray]]
    params: dict[str, Any] = field(default_factory=dict)
    clip_norm: float | None = None
    needs_individual_updates: bool | None = None
    """False for a rule that needs only the updates' weighted sum: a round then folds each update in as
    it arrives. ``build_aggregator`` takes it from the registry entry; None (resolved on construction):
    False only for the plain weighted mean, as a strategy given ``weighted_mean`` itself expects."""

    def __post_init__(self) -> None:
        if self.needs_individual_updates is None:
            object.__setattr__(self, "needs_individual_updates", not (self.rule is weighted_mean and not self.params))

    def __call__(self, updates: Sequence[NamedArrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
        if self.clip_norm is None:
            return self.unclipped(updates, weights)
        return self.rule(updates, weights, clip_norm=self.clip_norm, **self.params)

    def unclipped(self, updates: Sequence[NamedArrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
        return self.rule(updates, weights, **self.params)

    def describe(self) -> str:
        bits = [f"{k}={v}" for k, v in self.params.items()]
        if self.clip_norm is not None:
            bits.append(f"clip_norm={self.clip_norm}")
        return f"{self.name}({', '.join(bits)})"

    @classmethod
    def of(cls, fn: Aggregator | AggregateFn) -> Aggregator:
        """``fn`` itself if it is an Aggregator; a plain rule function is wrapped (no clipping)."""
        if isinstance(fn, Aggregator):
            return fn
        return cls(getattr(fn, "__name__", "custom"), fn)


def build_aggregator(settings: CoordinatorSettings) -> Aggregator:
    """The rule ``settings.aggregator`` names in the registry, with the settings it reads bound
    (each validated when the settings load)."""
    entry = RULES.entry(settings.aggregator)
    return Aggregator(entry.name, entry.value.fn, entry.value.bind(settings), settings.clip_norm,
                      needs_individual_updates(entry))
