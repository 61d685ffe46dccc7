"""The configured aggregator: one rule from coordinator.aggregation, its parameters, and clipping."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.aggregation import (
    NamedArrays,
    coordinate_median,
    krum,
    multi_krum,
    trimmed_mean,
    weighted_mean,
)
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
    """The aggregator ``settings`` name, with its parameters (validated when settings load)."""
    f = settings.byzantine_f
    clip = settings.clip_norm
    if settings.aggregator == "mean":
        return Aggregator("mean", weighted_mean, {}, clip)
    if settings.aggregator == "median":
        return Aggregator("median", coordinate_median, {"f": f}, clip)
    if settings.aggregator == "trimmed_mean":
        return Aggregator("trimmed_mean", trimmed_mean, {"beta": settings.trim_beta, "f": f}, clip)
    if settings.aggregator == "krum":
        return Aggregator("krum", krum, {"f": f}, clip)
    if settings.aggregator == "multi_krum":
        return Aggregator("multi_krum", multi_krum, {"f": f, "m": settings.multi_krum_m}, clip)
    raise ValueError(f"unknown aggregator {settings.aggregator!r}")
