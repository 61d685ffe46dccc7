"""FedProx (Li et al., 2020): FedAvg whose agents add a proximal term ``mu/2 ||w - w_global||^2``.

The server side is FedAvg's; what differs is announced: ``mu`` travels with every round, so
the agents' local objective follows the coordinator's setting. With ``mu = 0`` it is FedAvg.
"""

from __future__ import annotations

from coordinator.aggregation.aggregator import AggregateFn, Aggregator, build_aggregator
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.fedavg import FedAvg


class FedProx(FedAvg):
    algorithm = "fedprox"

    def __init__(self, aggregator: Aggregator | AggregateFn, mu: float, server_learning_rate: float = 1.0) -> None:
        super().__init__(aggregator, server_learning_rate=server_learning_rate)
        if mu < 0:
            raise ValueError(f"fedprox mu must be non-negative, got {mu}")
        self.mu = mu

    def round_params(self, round_number: int) -> dict[str, float | int | bool]:
        return {"mu": self.mu}


def build(settings: CoordinatorSettings) -> FedProx:
    """The ``fedprox`` entry of ``coordinator/strategies/registry.py``."""
    return FedProx(build_aggregator(settings), mu=settings.prox_mu, server_learning_rate=settings.server_learning_rate)
