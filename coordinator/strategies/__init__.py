"""One file per federated algorithm; ``build_strategy`` picks one from the settings."""

from __future__ import annotations

from coordinator.settings import CoordinatorSettings
from coordinator.strategies.base import Strategy
from coordinator.strategies.fedavg import FedAvg
from coordinator.strategies.fedproto import FedProto
from coordinator.strategies.fedprox import FedProx
from coordinator.strategies.scaffold import Scaffold


def build_strategy(settings: CoordinatorSettings) -> Strategy:
    from coordinator.aggregation.aggregator import build_aggregator

    aggregator = build_aggregator(settings)
    strategy: Strategy
    if settings.algorithm == "fedavg":
        strategy = FedAvg(aggregator, server_learning_rate=settings.server_learning_rate)
    elif settings.algorithm == "fedprox":
        strategy = FedProx(aggregator, mu=settings.prox_mu, server_learning_rate=settings.server_learning_rate)
    elif settings.algorithm == "scaffold":
        strategy = Scaffold(aggregator, server_learning_rate=settings.server_learning_rate)
    elif settings.algorithm == "fedproto":
        strategy = FedProto(aggregator, settings.proto_lambda, warmup_rounds=settings.proto_warmup_rounds,
                            momentum=settings.proto_momentum, normalize=settings.proto_normalize)
    else:
        raise ValueError(f"unknown algorithm {settings.algorithm!r}")
    strategy.publish_states_as = "float16" if settings.state_compression == "fp16" else "float32"
    return strategy


__all__ = ["FedAvg", "FedProto", "FedProx", "Scaffold", "Strategy", "build_strategy"]
