"""Accuracy and seconds per round of one task's families, through the real coordinator and agents.

    python bench/accuracy.py --task mnist-5k            # the table below (about 20 minutes on 2 cores)
    python bench/accuracy.py --task basic-motions --quick

Rows, all on the task's built-in set and its test split (which no agent sees): centralised
training of the large family on the pooled data (the upper bound); FedAvg on an IID split for
every family the task has (accuracy and seconds per round of each); FedAvg and SCAFFOLD on a
Dirichlet split for the large family. Every federated row uses the same partition seed, model
initialisation and local shuffles; accuracy is the global model's on the test split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from edge_agent.tasks import resolve_task
from launcher.broker import MosquittoBroker
from launcher.scenarios import FleetConfig, ScenarioResult, TrainConfig, centralised, federated

GOALS: dict[str, tuple[float, float]] = {"mnist-5k": (0.97, 0.015)}
"""Per task: (centralised at least, FedAvg IID at most this far below it)."""


@dataclass(frozen=True)
class TaskPlan:
    agents: int
    fraction: float
    rounds: int
    central_epochs: int
    local_epochs: int
    learning_rate: float
    momentum: float
    alpha: float
    batch_size: int = 32


FULL = TaskPlan(agents=10, fraction=1.0, rounds=30, central_epochs=30, local_epochs=2, learning_rate=0.02,
                momentum=0.9, alpha=0.5)
QUICK = TaskPlan(agents=4, fraction=0.5, rounds=2, central_epochs=1, local_epochs=1, learning_rate=0.02,
                 momentum=0.9, alpha=0.5)
SCAFFOLD_LEARNING_RATE_SCALE = 2.5
"""SCAFFOLD steps plain SGD (momentum 0): about the step size of SGD at momentum 0.9 takes a larger rate."""


@dataclass
class TaskRow:
    name: str
    family: str
    partition: str
    rounds: int
    """Training rounds (epochs, centralised)."""
    result: ScenarioResult
    key: str

    @property
    def seconds_per_round(self) -> float:
        return self.result.wall_s / max(self.rounds, 1)


def run(task_name: str, plan: TaskPlan, broker: MosquittoBroker, workdir: Path) -> list[TaskRow]:
    task = resolve_task(task_name)
    main_family = task.family_for("jetson")
    per_round = f"{math.ceil(plan.fraction * plan.agents)}/{plan.agents}"

    def train(algorithm: str) -> TrainConfig:
        scaffold = algorithm == "scaffold"  # it corrects plain SGD steps: momentum 0
        rate = plan.learning_rate * (SCAFFOLD_LEARNING_RATE_SCALE if scaffold else 1.0)
        return TrainConfig(algorithm, plan.rounds, plan.fraction, plan.local_epochs, rate,
                           0.0 if scaffold else plan.momentum, plan.batch_size)

    def fleet(family: str, partition: str) -> FleetConfig:
        return FleetConfig(plan.agents, ("cpu",), partition, alpha=plan.alpha, family=family, task=task_name)

    rows: list[TaskRow] = []

    def record(name: str, family: str, partition: str, rounds: int, key: str, result: ScenarioResult) -> None:
        rows.append(TaskRow(name, family, partition, rounds, result, key))
        print(f"  {name} ({family}, {partition}): {result.accuracy:.2%} in {result.wall_s:.0f}s", flush=True)

    record("centralised (pooled data)", main_family, "all", plan.central_epochs, "central",
           centralised(main_family, train("fedavg"), plan.central_epochs, workdir / "central", task=task_name))
    for family in task.families:  # the large family first: it is the one the Dirichlet rows use
        key = f"fedavg-iid-{family}"
        record(f"FedAvg {per_round}", family, "IID", plan.rounds, key,
               federated(fleet(family, "iid"), train("fedavg"), broker.url, workdir / key, f"bench-{key}", "global"))
    for algorithm in ("fedavg", "scaffold"):
        key = f"{algorithm}-dir-{main_family}"
        name = f"{'FedAvg' if algorithm == 'fedavg' else 'SCAFFOLD'} {per_round}"
        record(name, main_family, f"Dir({plan.alpha:g})", plan.rounds, key,
               federated(fleet(main_family, "dirichlet"), train(algorithm), broker.url, workdir / key,
                         f"bench-{key}".replace(".", "_"), "global"))
    return rows


def render(rows: list[TaskRow]) -> str:
    header = f"{'row':<28} {'family':<14} {'partition':<10} {'rounds':>6} {'test acc':>9} {'held-out':>9} " \
             f"{'s/round':>8} {'time s':>7}"
    lines = [header, "-" * len(header)]
    for row in rows:
        r = row.result
        rounds = f"{row.rounds}ep" if row.key == "central" else str(row.rounds)
        held = "-" if r.validation is None else f"{r.validation:.2%}"
        lines.append(f"{row.name:<28} {row.family:<14} {row.partition:<10} {rounds:>6} {r.accuracy:>9.2%} "
                     f"{held:>9} {row.seconds_per_round:>8.2f} {r.wall_s:>7.0f}")
    return "\n".join(lines)


def goals(task_name: str, rows: list[TaskRow]) -> list[tuple[bool, str]]:
    if task_name not in GOALS:
        return []
    at_least, gap = GOALS[task_name]
    by_key = {row.key: row for row in rows}
    central = by_key["central"]
    iid = by_key[f"fedavg-iid-{central.family}"].result.accuracy
    c = central.result.accuracy
    return [(c >= at_least, f"centralised at least {at_least:.0%}: {c:.2%}"),
            (c - iid <= gap, f"FedAvg IID ({central.family}) within {gap * 100:.1f} points of centralised: {iid:.2%} "
                             f"vs {c:.2%} ({(iid - c) * 100:+.2f} points)")]
