"""One file per federated algorithm; ``build_strategy`` picks one from the settings."""

from __future__ import annotations

from coordinator.config import CoordinatorSettings
from coordinator.strategies.base import Strategy
from coordinator.strategies.fedavg import FedAvg
from coordinator.strategies.fedproto import FedProto
from coordinator.strategies.fedprox import FedProx
from coordinator.strategies.scaffold import Scaffold


def build_strategy(settings: CoordinatorSettings) -> Strategy:
    from coordinator.aggregators import build_aggregator

    aggregator = build_aggregator(settings)
    if settings.algorithm == "fedavg":
        return FedAvg(aggregator, server_learning_rate=settings.server_learning_rate)
    if settings.algorithm == "fedprox":
        return FedProx(aggregator, mu=settings.prox_mu, server_learning_rate=settings.server_learning_rate)
    if settings.algorithm == "scaffold":
        return Scaffold(aggregator, server_learning_rate=settings.server_learning_rate)
    if settings.algorithm == "fedproto":
        return FedProto(aggregator, settings.proto_lambda, warmup_rounds=settings.proto_warmup_rounds,
                        momentum=settings.proto_momentum, normalize=settings.proto_normalize)
    raise ValueError(f"unknown algorithm {settings.algorithm!r}")


__all__ = ["FedAvg", "FedProto", "FedProx", "Scaffold", "Strategy", "build_strategy"]
