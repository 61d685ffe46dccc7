"""One file per federated algorithm; ``build_strategy`` picks one from the settings."""

from __future__ import annotations

from coordinator.config import CoordinatorSettings
from coordinator.strategies.base import Strategy
from coordinator.strategies.fedavg import FedAvg


def build_strategy(settings: CoordinatorSettings) -> Strategy:
    from coordinator.aggregators import build_aggregator

    aggregator = build_aggregator(settings)
    if settings.algorithm == "fedavg":
        return FedAvg(aggregator, server_learning_rate=settings.server_learning_rate)
    raise ValueError(f"unknown algorithm {settings.algorithm!r}")


__all__ = ["Strategy", "FedAvg", "build_strategy"]
