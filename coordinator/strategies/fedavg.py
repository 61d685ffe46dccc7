"""FedAvg (McMahan et al., 2017): the sample-weighted average of client deltas.

With a robust aggregator configured, "average" becomes that rule (median, trimmed mean,
Krum, Multi-Krum) over the same deltas; the server step is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from coordinator.aggregation.aggregator import AggregateFn, Aggregator, build_aggregator
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.base import Dropped, FamilyState, Strategy, group_by_family
from coordinator.strategies.bootstrap import owned
from protocol.messages import Update


def apply_delta(weights: dict[str, np.ndarray], delta: dict[str, np.ndarray], lr: float) -> dict[str, np.ndarray]:
    """weights + lr * delta for floating arrays; integer arrays add the delta unscaled.

    Results stay arrays for 0-d inputs too (numpy arithmetic on those yields scalars).
    """
    out = {}
    for name, value in weights.items():
        if value.dtype.kind in "fc":
            with np.errstate(over="ignore"):  # an overflow to inf fails the round (FamilyState checks)
                out[name] = np.asarray(value.astype(np.float64) + lr * delta[name].astype(np.float64)).astype(value.dtype)
        else:
            out[name] = np.asarray(value + delta[name]).astype(value.dtype)
    return out


class FedAvg(Strategy):
    algorithm = "fedavg"

    def __init__(self, aggregator: Aggregator | AggregateFn, server_learning_rate: float = 1.0) -> None:
        super().__init__(aggregator)
        self.server_learning_rate = server_learning_rate

    def aggregate(self, round_number: int, updates: Sequence[Update],
                  population: Mapping[str, int] | None = None) -> list[Dropped]:
        dropped: list[Dropped] = []
        new_states: dict[str, FamilyState] = {}
        for family, group in group_by_family(updates).items():
            state = self.states.get(family)
            if state is None:
                # Bootstrap: the seeded initial weights a strict majority sent alike, exactly; else none yet.
                group, left_out = self.first_state(family, group)
                dropped += left_out
                if not group:
                    continue
                merged = owned(group[0].weights)
            else:
                mean_delta = self.combine(group, "delta")
                merged = apply_delta(state.weights, mean_delta, self.server_learning_rate)
            new_states[family] = self.new_state(round_number + 1, merged)
        self.states.update(new_states)  # only once every family aggregated: a failure changes nothing
        return dropped


def build(settings: CoordinatorSettings) -> FedAvg:
    """The ``fedavg`` entry of ``coordinator/strategies/registry.py``."""
    return FedAvg(build_aggregator(settings), server_learning_rate=settings.server_learning_rate)
