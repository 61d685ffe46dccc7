"""Algorithms and compressors are looked up in registries: the coordinator's settings accept exactly
the registered names, and each algorithm declares what it reads and runs with (its agent-side half:
tests/unit/edge_agent/test_open_names.py, which may import torch)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from coordinator.strategies import ALGORITHMS, build_strategy
from protocol.compression import COMPRESSORS, state_compressors


def test_settings_take_the_registered_algorithms_and_nothing_else() -> None:
    assert ALGORITHMS.names() == ("fedavg", "fedprox", "scaffold", "fedproto")
    schema = CoordinatorSettings.model_json_schema()["properties"]["algorithm"]
    assert schema["enum"] == list(ALGORITHMS.names())
    with pytest.raises(ValidationError, match="fedfuture"):
        CoordinatorSettings(algorithm="fedfuture")


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "fedproto"])
def test_each_entry_builds_its_strategy_from_the_settings_it_declares(name: str) -> None:
    entry = ALGORITHMS.entry(name)
    assert set(entry.settings) <= set(CoordinatorSettings.model_fields)
    strategy = build_strategy(CoordinatorSettings(algorithm=name))
    assert strategy.algorithm == name and strategy.publish_states_as == "float32"
    assert build_strategy(CoordinatorSettings(algorithm=name, state_compression="fp16")).publish_states_as == "float16"


def test_the_modes_an_algorithm_declares_decide_what_settings_allow() -> None:
    assert [e.name for e in ALGORITHMS if e.supports("modes", "async")] == ["fedavg", "fedprox"]
    CoordinatorSettings(algorithm="fedprox", mode="async")
    with pytest.raises(ValidationError, match="mode async runs fedavg or fedprox, not fedproto"):
        CoordinatorSettings(algorithm="fedproto", mode="async")


def test_compression_settings_take_registered_compressors_only() -> None:
    assert COMPRESSORS.names() == ("fp16", "int8", "topk") and state_compressors() == ("fp16",)
    assert CoordinatorSettings(compression="topk:1e-2", momentum=0.0).compression == "topk:0.01"
    with pytest.raises(ValidationError, match="unknown compression 'zstd'"):
        CoordinatorSettings(compression="zstd")
    with pytest.raises(ValidationError, match="'none' or 'fp16'"):
        CoordinatorSettings(state_compression="int8")
    with pytest.raises(ValidationError, match="compression topk:0.01 needs momentum 0"):
        CoordinatorSettings(compression="topk:0.01")  # topk declares error feedback
