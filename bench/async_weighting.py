"""KL weighting against sample-count weighting on a strongly skewed fleet (bench/async.py, part 2).

One synchronous FedAvg federation per row through the real coordinator and agents, on the same
Dirichlet split; only ``--weighting`` differs. Scored on the digits test split: accuracy, and
the spread of per-class accuracy (its standard deviation and its worst class), since down-
weighting skewed agents helps the classes they hold least and may cost the ones they hold most.
A class that falls under ``ERASED`` is flagged: on Dirichlet(0.1) one or two skewed agents may hold
nearly all of a class, and down-weighting them (unprotected ``exp(-KL/T)``) took that class to 0%.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from coordinator.settings import CoordinatorSettings
from edge_agent.config import AgentSettings
from edge_agent.tasks.registry import resolve_task
from edge_agent.tasks.splits import pool_and_test
from edge_agent.weights import set_arrays
from launcher.inprocess import run_federation

ERASED = 0.05
"""Per-class test accuracy under which a class counts as erased (flagged in the table and the verdicts)."""


@dataclass(frozen=True)
class SkewPlan:
    agents: int
    alpha: float
    rounds: int
    family: str
    local_epochs: int
    learning_rate: float
    temperature: float
    batch_size: int = 16
    momentum: float = 0.0
    """Plain local SGD: on a split this skewed, momentum amplifies client drift (bench/accuracy.py's tuning)."""
    bounded: bool = True
    """The coordinator's default bounds on influence (claims cut to the round's median claim, deltas clipped to its
    median norm); False: claims uncapped, nothing clipped (what the table measured before those defaults)."""


@dataclass
class SkewResult:
    accuracy: float
    per_class: np.ndarray
    min_factor: float | None
    wall_s: float

    @property
    def spread(self) -> float:
        return float(self.per_class.std())

    @property
    def worst(self) -> float:
        return float(self.per_class.min())

    @property
    def erased(self) -> list[int]:
        """Classes the global model (nearly) never predicts right."""
        return [int(c) for c in np.flatnonzero(self.per_class < ERASED)]


def run_weighting(plan: SkewPlan, weighting: str, broker_url: str, workdir: Path, seed: int = 0) -> SkewResult:
    task = resolve_task("digits")
    _, test = pool_and_test(task, None, seed)
    federation = f"skew-{weighting}"
    coordinator = CoordinatorSettings(
        federation=federation, broker_url=broker_url, state_dir=workdir / federation / "coordinator",
        rounds=plan.rounds, min_available_agents=plan.agents, min_fit_agents=plan.agents, fraction_fit=1.0,
        local_epochs=plan.local_epochs, learning_rate=plan.learning_rate, momentum=plan.momentum, batch_size=plan.batch_size, seed=seed,
        init_seed=seed,
        round_deadline_s=600.0, quorum_fraction=1.0, evaluate_final=False, weighting=weighting,  # type: ignore[arg-type]
        kl_temperature=plan.temperature, **({} if plan.bounded else {"claim_cap_multiple": 0.0, "max_norm_ratio": 0.0}),
    )
    agents = [AgentSettings(
        federation=federation, broker_url=broker_url, device="cpu", agent_id=f"cpu-{i}",
        state_dir=workdir / federation / "agents" / str(i), family=plan.family, partition="dirichlet",
        num_partitions=plan.agents, partition_index=i, alpha=plan.alpha, min_size=5, data_seed=seed,
        heartbeat_s=30.0) for i in range(plan.agents)]
    result = run_federation(coordinator, agents, timeout_s=1800.0)
    model = task.build_model(plan.family, seed)
    set_arrays(model, result.strategy.states[plan.family].weights)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(test.x)).argmax(1).numpy()
    per_class = np.array([(predicted[test.y == c] == c).mean() for c in range(task.num_outputs)])
    registry = result.service.metrics.registry
    return SkewResult(float((predicted == test.y).mean()), per_class,
                      registry.get_sample_value("fl_weighting_factor_min"), result.wall_s)


def render(plan: SkewPlan, rows: list[tuple[str, SkewResult]]) -> str:
    header = (f"{'weighting':<28} {'test acc':>9} {'per-class std':>13} {'worst class':>15} {'min factor':>10} "
              f"{'time s':>7}  erased (<{ERASED:.0%})")
    lines = [header, "-" * len(header)]
    for name, r in rows:
        factor = "-" if r.min_factor is None else f"{r.min_factor:.3f}"
        worst = f"{r.worst:.2%} (#{int(r.per_class.argmin())})"
        erased = ", ".join(f"#{c}" for c in r.erased) or "-"
        lines.append(f"{name:<28} {r.accuracy:>9.2%} {r.spread:>13.4f} {worst:>15} {factor:>10} {r.wall_s:>7.0f}  "
                     f"{erased}")
    return "\n".join(lines)


def skew_goals(samples: SkewResult, kl: SkewResult) -> list[tuple[bool, str]]:
    """KL weighting must gain accuracy without losing a class: the issue-26 goals, and the erased-class flag."""
    erased = ", ".join(f"#{c} at {kl.per_class[c]:.2%}" for c in kl.erased)
    return [
        (kl.accuracy >= samples.accuracy,
         f"kl accuracy >= sample weighting's: {kl.accuracy:.2%} vs {samples.accuracy:.2%}"),
        (kl.worst >= samples.worst,
         f"kl worst-class accuracy >= sample weighting's: {kl.worst:.2%} vs {samples.worst:.2%}"),
        (set(kl.erased) <= set(samples.erased),
         f"kl erases no class sample weighting keeps (<{ERASED:.0%}): " + (erased or "none erased")),
    ]
