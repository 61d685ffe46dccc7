"""The registry of federated algorithms, server side (``--algorithm``); the agents' halves are in
``edge_agent/algorithms/registry.py`` under the same names.

An entry's value is a factory from the coordinator's settings to a fresh ``Strategy``; it
declares the settings it reads and its compatibility: ``modes`` (round policies, the ``mode``
setting), ``payloads`` (what its updates carry: ``weights``, ``delta``, ``control``,
``prototypes``), ``dp`` (whether agents training under DP can take part: ``off``, ``on``) and
``secure`` (whether it runs under secure aggregation, ``coordinator/policies/secure.py``).

Built-ins are registered here by reference, ``"module:function"``, and imported when first
built, the way installed plugins are named by their entry points (``edgefl.algorithms``):
``coordinator.settings`` reads these names to type its ``algorithm`` field, and the strategy
modules import the aggregation rules, which import the settings. So this module imports no
coordinator module at all, and adding an algorithm is its strategy file (with a ``build``
function) plus one registration line below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from protocol.registry import Registry

StrategyFactory = Callable[[Any], Any]
"""settings -> Strategy (typed loosely: naming either type here would import the settings)."""

ALGORITHMS: Registry[StrategyFactory] = Registry("algorithm", "edgefl.algorithms")
"""Keyed by the ``algorithm`` setting's value, which is also the name announced on the wire."""

BOTH_MODES = ("sync", "async")
DP_EITHER = ("off", "on")


def by_reference(reference: str) -> StrategyFactory:
    """A factory that imports ``"package.module:function"`` when first called, and calls it."""
    module_name, _, function_name = reference.partition(":")

    def build(settings: Any) -> Any:
        return getattr(importlib.import_module(module_name), function_name)(settings)

    build.__qualname__ = f"by_reference({reference!r})"
    return build


ALGORITHMS.register(
    "fedavg", by_reference("coordinator.strategies.fedavg:build"),
    summary="FedAvg: the sample-weighted mean of the agents' deltas",
    settings=("server_learning_rate",), modes=BOTH_MODES, payloads=("weights", "delta"), dp=DP_EITHER,
    secure=("off", "on"))
ALGORITHMS.register(
    "fedprox", by_reference("coordinator.strategies.fedprox:build"),
    summary="FedProx: FedAvg whose agents add a proximal term mu/2 ||w - w_global||^2",
    settings=("prox_mu", "server_learning_rate"), modes=BOTH_MODES, payloads=("weights", "delta"), dp=DP_EITHER,
    secure=("off", "on"))
ALGORITHMS.register(
    "scaffold", by_reference("coordinator.strategies.scaffold:build"),
    summary="SCAFFOLD: deltas corrected by control variates (local momentum 0 unless set)",
    settings=("server_learning_rate", "scaffold_correct_head", "scaffold_absent_class_scale"), modes=("sync",),
    payloads=("weights", "delta", "control"), dp=DP_EITHER,
    secure=("off", "on"))
ALGORITHMS.register(
    "fedproto", by_reference("coordinator.strategies.fedproto:build"),
    summary="FedProto: agents of any model family share class prototypes, never weights",
    settings=("proto_lambda", "proto_warmup_rounds", "proto_momentum", "proto_normalize"), modes=("sync",),
    payloads=("prototypes",), dp=DP_EITHER, secure=("off", "on"))
