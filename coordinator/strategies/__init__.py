"""One file per federated algorithm, each named in ``ALGORITHMS`` (``registry.py``);
``build_strategy`` builds the one the settings name.

Nothing here imports a strategy module eagerly: ``coordinator.settings`` imports
``coordinator.strategies.registry`` (and so this package) to read the algorithm names, and the
strategy modules import the settings through the aggregation rules. The classes are re-exported
lazily, on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from coordinator.strategies.registry import ALGORITHMS

if TYPE_CHECKING:
    from coordinator.settings import CoordinatorSettings
    from coordinator.strategies.base import Strategy
    from coordinator.strategies.fedavg import FedAvg
    from coordinator.strategies.fedproto import FedProto
    from coordinator.strategies.fedprox import FedProx
    from coordinator.strategies.scaffold import Scaffold

_LAZY = {"Strategy": "base", "FedAvg": "fedavg", "FedProx": "fedprox", "Scaffold": "scaffold", "FedProto": "fedproto"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_strategy(settings: CoordinatorSettings) -> Strategy:
    """The strategy ``settings.algorithm`` names, publishing states as ``settings.state_compression`` says."""
    strategy: Strategy = ALGORITHMS.get(settings.algorithm)(settings)
    # The wire defines one compressed form of a global state, half precision (agents widen it back);
    # it is what every compressor that declares the global_state payload (fp16) publishes.
    strategy.publish_states_as = "float32" if settings.state_compression == "none" else "float16"
    return strategy


__all__ = ["ALGORITHMS", "FedAvg", "FedProto", "FedProx", "Scaffold", "Strategy", "build_strategy"]
