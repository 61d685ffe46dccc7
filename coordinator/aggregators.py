"""Aggregators by name: a configured callable over named arrays and weights."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from coordinator.aggregation import NamedArrays, weighted_mean
from coordinator.config import CoordinatorSettings

Aggregator = Callable[[Sequence[NamedArrays], Sequence[float]], dict[str, np.ndarray]]


def build_aggregator(settings: CoordinatorSettings) -> Aggregator:
    if settings.aggregator == "mean":
        return weighted_mean
    raise ValueError(f"unknown aggregator {settings.aggregator!r}")
