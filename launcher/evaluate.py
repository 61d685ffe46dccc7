"""Central evaluation after a run: each family's final global model on the held-back test set.

The agents only ever see their partitions of the training pool; the test split that
``pool_and_test`` returns next to it is touched by no one during the run, so this is the
honest number to quote.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coordinator.state.checkpoint import CheckpointStore

if TYPE_CHECKING:
    import numpy as np

    from edge_agent.data.datasets import Dataset
    from edge_agent.tasks.base import Task
    from edge_agent.training import EvalResult


@dataclass(frozen=True)
class FamilyEvaluation:
    family: str
    accuracy: float | None
    """None for a task that reports no accuracy (regression)."""
    loss: float
    agents: int
    """Agents of the fleet that train this family (the weight in the overall figure)."""
    trained_rounds: int
    """Round the global state is for, minus one: how many aggregations it has been through."""


@dataclass(frozen=True)
class CentralEvaluation:
    families: dict[str, FamilyEvaluation]
    overall_accuracy: float | None
    """Mean over agents: each agent scored with its family's global model (weights = agents per family)."""
    test_samples: int
    dataset: str
    missing: list[str]
    """Families the fleet trains that have no global model in the checkpoint (never aggregated)."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["overall_weighting"] = "mean over agents (family accuracy weighted by its number of agents)"
        return data


def load_family_weights(state_dir: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    """{family: (round, weights)} from the coordinator's checkpoint; empty if there is none.

    Families without weights (FedProto shares prototypes only; the models stay on the agents)
    are left out: there is no global model to evaluate.
    """
    saved = CheckpointStore(Path(state_dir)).load("checkpoint")
    if saved is None:
        return {}
    families = saved["strategy"]["families"]
    return {name: (int(state["round"]), state["weights"]) for name, state in families.items() if state["weights"]}


def score_weights(family: str, weights: Mapping[str, np.ndarray], test: Dataset, task: Task) -> EvalResult:
    """``task``'s ``family`` model holding ``weights``, scored by the task's loss and metrics on ``test`` on the CPU."""
    import torch  # only here: the launcher's other parts stay light

    from edge_agent.training import evaluate
    from edge_agent.weights import set_arrays

    model = task.build_model(family, seed=0)  # the seed is overwritten below
    set_arrays(model, weights)
    return evaluate(model, test, torch.device("cpu"), task.objective)


def central_evaluation(state_dir: Path, agent_families: list[str], *, task: str = "digits", data: str | None = None,
                       data_seed: int = 0) -> CentralEvaluation:
    """Evaluate every family's global model from ``state_dir`` on the test split of ``task``'s ``data``
    (default: the task's built-in set).

    ``agent_families`` lists each agent's family (one entry per agent) for the overall figure.
    """
    from edge_agent.tasks.registry import resolve_task
    from edge_agent.tasks.splits import pool_and_test

    run_task = resolve_task(task)
    _, test = pool_and_test(run_task, data, data_seed)
    counts = Counter(agent_families)
    results: dict[str, FamilyEvaluation] = {}
    for family, (round_number, weights) in sorted(load_family_weights(state_dir).items()):
        scored = score_weights(family, weights, test, run_task)
        results[family] = FamilyEvaluation(family, scored.accuracy, scored.loss, counts.get(family, 0),
                                           max(round_number - 1, 0))
    weighted = [(r.accuracy, r.agents) for r in results.values() if r.agents and r.accuracy is not None]
    total_agents = sum(counts.values())
    missing = sorted(set(counts) - set(results))
    # A family without a model scores nothing for its agents: count them as 0, not silently skip them.
    overall = sum(a * n for a, n in weighted) / total_agents if total_agents and weighted else None
    return CentralEvaluation(results, overall, len(test), test.name, missing)
