"""Synchronous rounds against FedBuff on a fleet of slow, uneven devices (bench/async.py, part 1).

Each row is one federation through the real coordinator and agents (threads of this process,
each with its own MQTT connection) over a Mosquitto broker. Agents cycle jetson, rpi and phone
with the straggler profiles (extra seconds per round: lognormal medians 0.5, 3 and 6, the
phone's heavy-tailed); all run one model family so that every row's global model is scored
the same way, on the digits test split no agent sees. Every published version's weights are
kept with the wall time it was published, and scored after the run, so scoring costs no row
any time.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.round.engine import RoundEngine
from coordinator.settings import CoordinatorSettings
from coordinator.state.rounds import RoundSummary
from edge_agent.config import AgentSettings
from edge_agent.tasks.registry import resolve_task
from edge_agent.tasks.splits import pool_and_test
from launcher.evaluate import score_weights
from launcher.inprocess import run_federation


@dataclass(frozen=True)
class FleetPlan:
    agents: int
    family: str
    partition: str
    alpha: float
    straggler_delay: str
    local_epochs: int
    learning_rate: float
    batch_size: int
    budget_s: float
    """The fixed wall-clock budget the 'accuracy at budget' column reads the curve at."""
    target: float
    """The accuracy 'time to target' waits for."""


@dataclass(frozen=True)
class Mode:
    name: str
    rounds: int
    settings: dict[str, Any]


@dataclass
class Curve:
    """(seconds since the run started, global weights) per published version, scored after the run."""

    points: list[tuple[float, float]] = field(default_factory=list)
    versions: int = 0
    wall_s: float = 0.0
    stale_dropped: int = 0
    mean_staleness: float | None = None

    def time_to(self, target: float) -> float | None:
        return next((t for t, accuracy in self.points if accuracy >= target), None)

    def at(self, seconds: float) -> float:
        reached = [accuracy for t, accuracy in self.points if t <= seconds]
        return reached[-1] if reached else 0.0

    @property
    def final(self) -> float:
        return self.points[-1][1] if self.points else 0.0


def run_mode(plan: FleetPlan, mode: Mode, broker_url: str, workdir: Path, seed: int = 0) -> Curve:
    task = resolve_task("digits")
    _, test = pool_and_test(task, None, seed)
    federation = "async-" + re.sub(r"[^A-Za-z0-9]+", "-", mode.name).strip("-")[:50]
    coordinator = CoordinatorSettings(
        federation=federation, broker_url=broker_url, state_dir=workdir / federation / "coordinator",
        rounds=mode.rounds, min_available_agents=plan.agents, min_fit_agents=1, local_epochs=plan.local_epochs,
        learning_rate=plan.learning_rate, batch_size=plan.batch_size, seed=seed, init_seed=seed,
        agent_timeout_s=600.0, evaluate_final=False, **mode.settings,
    )
    devices = ("jetson", "rpi", "phone")
    agents = [AgentSettings(
        federation=federation, broker_url=broker_url, device=devices[i % 3], agent_id=f"{devices[i % 3]}-{i}",  # type: ignore[arg-type]
        state_dir=workdir / federation / "agents" / str(i), family=plan.family, partition=plan.partition,  # type: ignore[arg-type]
        num_partitions=plan.agents, partition_index=i, alpha=plan.alpha, data_seed=seed, heartbeat_s=30.0,
        straggler_delay=plan.straggler_delay) for i in range(plan.agents)]
    snapshots: list[tuple[float, dict[str, np.ndarray]]] = []
    started = time.perf_counter()

    def keep(summary: RoundSummary, engine: RoundEngine) -> None:
        state = engine.strategy.states.get(plan.family)
        if summary.task == "train" and summary.outcome == "completed" and state is not None:
            snapshots.append((time.perf_counter() - started, {k: v.copy() for k, v in state.weights.items()}))

    result = run_federation(coordinator, agents, timeout_s=1800.0, on_round_closed=keep)
    curve = Curve(versions=len(snapshots), wall_s=time.perf_counter() - started)
    for seconds, weights in snapshots:
        curve.points.append((seconds, score_weights(plan.family, weights, test, task).accuracy or 0.0))
    registry = result.service.metrics.registry
    curve.stale_dropped = int(registry.get_sample_value("fl_messages_rejected_total",
                                                        {"kind": "update", "reason": "too_stale"}) or 0)
    count = registry.get_sample_value("fl_update_staleness_versions_count") or 0
    total = registry.get_sample_value("fl_update_staleness_versions_sum") or 0
    curve.mean_staleness = total / count if count else None
    return curve


def render(plan: FleetPlan, rows: list[tuple[Mode, Curve]]) -> str:
    header = (f"{'mode':<34} {'versions':>8} {'to ' + format(plan.target, '.0%'):>8} {'acc @' + format(plan.budget_s, '.0f') + 's':>9} "
              f"{'final':>7} {'wall s':>7} {'staleness':>9} {'too stale':>9}")
    lines = [header, "-" * len(header)]
    for mode, curve in rows:
        reach = curve.time_to(plan.target)
        stale = "-" if curve.mean_staleness is None else f"{curve.mean_staleness:.2f}"
        lines.append(f"{mode.name:<34} {curve.versions:>8} {'never' if reach is None else f'{reach:.0f}s':>8} "
                     f"{curve.at(plan.budget_s):>9.2%} {curve.final:>7.2%} {curve.wall_s:>7.0f} {stale:>9} "
                     f"{curve.stale_dropped:>9}")
    return "\n".join(lines)
