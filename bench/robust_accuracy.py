"""Accuracy under attack through the real round engine (bench/robust.py).

Each cell is one federation: the coordinator service and every agent on threads of this
process (launcher.inprocess), talking through a Mosquitto broker started by the bench.
The first k agents run an attack from the harness; the final global model is scored on the
digits test split that no agent ever sees.
"""

from __future__ import annotations

import itertools
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from coordinator.aggregation.registry import RULES
from coordinator.settings import CoordinatorSettings
from edge_agent.attacks import DEFAULT_SCALE, DEFAULT_Z, InProcessCollusion
from edge_agent.config import AgentSettings
from edge_agent.data.datasets import Dataset
from edge_agent.tasks.registry import resolve_task
from edge_agent.tasks.splits import pool_and_test
from launcher.broker import MosquittoBroker
from launcher.evaluate import score_weights
from launcher.inprocess import run_federation

AGGREGATORS = RULES.names()
"""Every registered rule, FedAvg's plain mean first."""
ATTACKS = ("sign_flip", "scaling", "gaussian_noise", "label_flip", "alie")
GOAL_POINTS = 3.0
GOAL_ATTACKS = ("sign_flip", "scaling")
GOAL_AGGREGATORS = ("median", "trimmed_mean", "krum")


@dataclass(frozen=True)
class Plan:
    agents: int
    rounds: int
    fractions: tuple[float, ...]
    attacks: tuple[str, ...]
    aggregators: tuple[str, ...]
    byzantine_f: int
    trim_beta: float
    local_epochs: int = 2
    learning_rate: float = 0.05
    momentum: float = 0.9
    device: str = "phone"
    deadline_s: float = 5.0
    """Rounds take well under a second here; a round nobody can answer (every agent's training
    diverged from a ruined model) waits this long before it is closed as quorum_missed."""
    clean_repeats: int = 1
    """Clean runs per aggregator: their spread shows the run-to-run noise (each run draws a new
    run id, which seeds the agents' shuffling); the verdicts compare against their mean."""

    def cells(self) -> list[tuple[str, int, str]]:
        """(attack, attackers, aggregator), the clean runs first."""
        clean = [("none", 0, a) for _ in range(self.clean_repeats) for a in self.aggregators]
        attacked = [(attack, round(fraction * self.agents), a)
                    for attack, fraction, a in itertools.product(self.attacks, self.fractions, self.aggregators)
                    if fraction > 0]
        return clean + attacked


FULL = Plan(agents=10, rounds=20, fractions=(0.1, 0.2, 0.3), attacks=ATTACKS, aggregators=AGGREGATORS,
            byzantine_f=3, trim_beta=0.3, clean_repeats=3)
QUICK = Plan(agents=5, rounds=3, fractions=(0.2,), attacks=("sign_flip",),
             aggregators=("mean", "median", "krum", "geometric_median"), byzantine_f=1, trim_beta=0.2)


@dataclass
class Cell:
    attack: str
    attackers: int
    aggregator: str
    accuracy: float | None
    rounds_completed: int
    rounds_failed: int
    admitted: int
    """Agents running an attack (each says so at start and in every update's metrics.extra)."""
    skipped: int
    """Rounds agents skipped because training from the global model diverged (logged errors)."""
    seconds: float


class SkipCounter(logging.Handler):
    """Counts the agents' "cannot answer round" errors instead of printing them (they would bury
    the table); any other error record is printed as usual."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "edge_agent.agent" and record.getMessage().startswith("cannot answer round"):
            self.count += 1
        else:
            print(f"{record.levelname} {record.name}: {record.getMessage()}", file=sys.stderr)


def describe_attacks(plan: Plan) -> list[str]:
    lines = []
    for attack in plan.attacks:
        if attack in DEFAULT_SCALE:
            lines.append(f"  {attack}: scale {DEFAULT_SCALE[attack]:g}")
        elif attack == "alie":
            lines.append(f"  alie: z = {DEFAULT_Z:g}, colluders pool their benign updates each round")
        else:
            lines.append(f"  {attack}: labels y -> 9 - y, delta sent as trained")
    return lines


def run_cell(plan: Plan, broker_url: str, workdir: Path, attack: str, attackers: int, aggregator: str,
             test_set: Dataset) -> Cell:
    federation = f"robust-{time.monotonic_ns()}"
    coordinator = CoordinatorSettings(
        federation=federation, broker_url=broker_url, state_dir=workdir / federation, rounds=plan.rounds,
        local_epochs=plan.local_epochs, learning_rate=plan.learning_rate, momentum=plan.momentum,
        min_available_agents=plan.agents, min_fit_agents=plan.agents, quorum_fraction=0.5,
        round_deadline_s=plan.deadline_s, evaluate_final=False, aggregator=aggregator,
        byzantine_f=plan.byzantine_f, trim_beta=plan.trim_beta, log_level="WARNING")
    agents = [AgentSettings(
        federation=federation, broker_url=broker_url, device=plan.device, agent_id=f"agent-{i:02d}",
        state_dir=workdir / federation / f"agent-{i:02d}", partition="iid", num_partitions=plan.agents,
        partition_index=i, attack=attack if i < attackers else "none", heartbeat_s=5.0, log_level="WARNING",
    ) for i in range(plan.agents)]
    errors = SkipCounter()
    logging.getLogger().addHandler(errors)
    started = time.perf_counter()
    try:
        result = run_federation(coordinator, agents, timeout_s=max(300.0, plan.rounds * plan.deadline_s * 2),
                                collusion=InProcessCollusion(max(attackers, 1), timeout_s=plan.deadline_s))
    finally:
        logging.getLogger().removeHandler(errors)
    states = result.strategy.states
    accuracy = None
    if states:
        (family, state), = states.items()
        accuracy = score_weights(family, state.weights, test_set, resolve_task("digits")).accuracy
    admitted = sum(1 for agent in result.agents if agent.worker.attack is not None)
    return Cell(attack, attackers, aggregator, accuracy,
                sum(1 for s in result.history if s.outcome == "completed"),
                sum(1 for s in result.history if s.outcome != "completed"), admitted, errors.count,
                time.perf_counter() - started)


def run_accuracy(plan: Plan, progress: bool = True) -> list[Cell]:
    logging.getLogger().setLevel(logging.ERROR)  # the attackers' start-up banners would flood the table
    torch.set_num_threads(1)
    _, test_set = pool_and_test(resolve_task("digits"))
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory() as tmp, MosquittoBroker(workdir=Path(tmp) / "broker") as broker:
        for attack, attackers, aggregator in plan.cells():
            cell = run_cell(plan, broker.url, Path(tmp), attack, attackers, aggregator, test_set)
            cells.append(cell)
            if progress:
                acc = "-" if cell.accuracy is None else f"{100 * cell.accuracy:.1f}%"
                print(f"  {attack:<15} {attackers:>2}/{plan.agents} {aggregator:<16} {acc:>6}  "
                      f"{cell.rounds_completed} rounds ok, {cell.rounds_failed} not, {cell.seconds:.1f}s"
                      + (f", {cell.skipped} agent-rounds skipped (training diverged)" if cell.skipped else ""),
                      flush=True)
    return cells


def mean_accuracy(cells: list[Cell], attack: str, attackers: int, aggregator: str) -> float:
    """Mean over the cell's runs; a run without any global model counts as 0."""
    runs = [c.accuracy or 0.0 for c in cells if (c.attack, c.attackers, c.aggregator) == (attack, attackers, aggregator)]
    return sum(runs) / len(runs)


def table(plan: Plan, cells: list[Cell]) -> list[str]:
    def fmt(attack: str, k: int, aggregator: str) -> str:
        runs = [c for c in cells if (c.attack, c.attackers, c.aggregator) == (attack, k, aggregator)]
        text = "-" if all(c.accuracy is None for c in runs) else f"{100 * mean_accuracy(cells, attack, k, aggregator):.1f}"
        return text + ("*" if any(c.rounds_failed for c in runs) else " ")

    widths = {a: max(14, len(a) + 2) for a in plan.aggregators}
    lines = [f"{'attack':<15} {'attackers':>9}  " + "".join(f"{a:>{widths[a]}}" for a in plan.aggregators),
             "-" * (27 + sum(widths.values()))]
    rows = [("none", 0)] + [(attack, round(f * plan.agents)) for attack in plan.attacks for f in plan.fractions
                            if f > 0]
    for attack, k in rows:
        label = f"{k}/{plan.agents} ({100 * k // plan.agents}%)"
        lines.append(f"{attack:<15} {label:>9}  " + "".join(f"{fmt(attack, k, a):>{widths[a]}}" for a in plan.aggregators))
    if plan.clean_repeats > 1:
        spread = []
        for aggregator in plan.aggregators:
            runs = [100 * (c.accuracy or 0.0) for c in cells if (c.attack, c.aggregator) == ("none", aggregator)]
            spread.append(f"{min(runs):.1f}-{max(runs):.1f}")
        lines.append(f"{'clean, range':<15} {f'{plan.clean_repeats} runs':>9}  "
                     + "".join(f"{s:>{widths[a]}}" for s, a in zip(spread, plan.aggregators, strict=True)))
    return lines


def verdicts(plan: Plan, cells: list[Cell]) -> list[tuple[bool, str]]:
    k = round(0.2 * plan.agents)
    clean_mean = mean_accuracy(cells, "none", 0, "mean")
    out = []
    for attack in (a for a in GOAL_ATTACKS if a in plan.attacks):
        for aggregator in (a for a in GOAL_AGGREGATORS if a in plan.aggregators):
            attacked = mean_accuracy(cells, attack, k, aggregator)
            own = mean_accuracy(cells, "none", 0, aggregator)
            worst = max(100 * (own - attacked), 100 * (clean_mean - attacked))
            out.append((worst <= GOAL_POINTS,
                        (f"{aggregator} with {k}/{plan.agents} {attack} attackers: {100 * attacked:.1f}%, "
                        f"{100 * (attacked - own):+.1f} points vs its clean run, "
                        f"{100 * (attacked - clean_mean):+.1f} vs clean FedAvg (goal: within {GOAL_POINTS:g} of both)")))
    return out
