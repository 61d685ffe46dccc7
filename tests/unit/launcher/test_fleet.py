"""Every device profile runs a family of every built-in task, and the launcher passes the fleet's task on."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.profiles import PROFILES
from edge_agent.tasks.registry import resolve_task
from launcher.fleet import DEVICES, AgentSpec, Fleet, FleetSpec, default_fleet
from protocol.tasks import BUILTIN_CARDS


@pytest.mark.parametrize("name", sorted(BUILTIN_CARDS))
def test_the_builtin_tasks_give_every_device_profile_a_family(name: str) -> None:
    task = resolve_task(name)
    assert set(PROFILES) <= set(task.device_families)
    assert set(task.device_families.values()) <= set(task.families)
    assert set(DEVICES) <= set(PROFILES)


def test_agents_train_their_task_s_family_for_their_device_unless_told_one() -> None:
    spec = FleetSpec(default_fleet(3), task="basic-motions")
    assert [spec.family_of(a) for a in spec.agents] == ["conv1d_large", "conv1d_small", "mlp_tiny"]
    assert FleetSpec(default_fleet(3)).family_of(AgentSpec("jetson-0", "jetson", 0)) == "cnn_large"  # digits
    told = FleetSpec([AgentSpec("a", "jetson", 0, {"family": "mlp_tiny"}), AgentSpec("b", "jetson", 1),
                      AgentSpec("c", "phone", 2, {"task": "basic-motions"})], agent_settings={"family": "cnn_small"})
    assert [told.family_of(a) for a in told.agents] == ["mlp_tiny", "cnn_small", "cnn_small"]


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_the_fleet_s_task_reaches_the_agents_and_the_coordinator(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, "mqtt://localhost:1883", FleetSpec(default_fleet(2), task="mnist-5k"), {})
    assert flag(fleet.coordinator.argv, "--task") == "mnist-5k"
    assert all(flag(a.argv, "--task") == "mnist-5k" and flag(a.argv, "--data") is None for a in fleet.agents.values())

    # A task that is not built in: the coordinator knows it by the card that start() writes ...
    plugin = Fleet(tmp_path, "mqtt://localhost:1883", FleetSpec(default_fleet(1), task="pkg.mod:task"), {})
    assert flag(plugin.coordinator.argv, "--task") == str(plugin.task_card)
    # ... unless its settings name one
    given = Fleet(tmp_path, "mqtt://localhost:1883", FleetSpec(default_fleet(1), task="shapes"),
                  {"task": "shapes.json"})
    assert flag(given.coordinator.argv, "--task") == "shapes.json"
    assert flag(given.agents["jetson-0"].argv, "--task") == "shapes"
