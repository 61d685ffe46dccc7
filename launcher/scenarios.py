"""Accuracy experiments on one machine: a federation in-process over a real broker, or
centralised training on the pooled data, scored on the held-back test split.

The agents never see the test split (``pool_and_test`` returns it beside the training pool they
partition), so the scores here are the honest ones to compare. Federated runs go through
``run_federation``: the real coordinator and agents, each with its own MQTT connection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from coordinator.round.engine import RoundEngine
from coordinator.settings import CoordinatorSettings
from coordinator.state.rounds import RoundSummary
from edge_agent.algorithms import RoundContext
from edge_agent.algorithms.fedavg import FedAvgClient
from edge_agent.algorithms.fedproto import personal_model_name
from edge_agent.config import AgentSettings
from edge_agent.data.datasets import Dataset
from edge_agent.data.local import build_local_data
from edge_agent.data.partition import ClientSummary, make_partition, summarize
from edge_agent.prototypes import embed_all, nearest_prototype
from edge_agent.state import AgentStateDir
from edge_agent.tasks.base import Task
from edge_agent.tasks.registry import resolve_task
from edge_agent.tasks.splits import pool_and_test
from edge_agent.training import evaluate, train_local
from edge_agent.weights import set_arrays
from launcher.evaluate import score_weights
from launcher.inprocess import run_federation
from protocol.messages import LocalTraining
from protocol.tasks import BUILTIN_CARDS

CPU = torch.device("cpu")


@dataclass(frozen=True)
class FleetConfig:
    agents: int
    devices: tuple[str, ...]
    """Device profiles, cycled over the agents (agent i holds partition i)."""
    partition: str
    alpha: float = 0.5
    classes_per_client: int = 3
    samples_per_class: int | None = None
    """At most this many samples of each class per agent (a few-shot fleet); None: no limit."""
    family: str | None = None
    """One model family for every agent; None: the one the task gives each device profile."""
    task: str = "digits"
    """The task every agent runs and the coordinator announces (a name or package.module:attr)."""
    data: str | None = None
    """A built-in set of the task to partition; None: the task's own."""
    data_seed: int = 0


@dataclass(frozen=True)
class TrainConfig:
    algorithm: str
    rounds: int
    fraction: float
    local_epochs: int
    learning_rate: float
    momentum: float | None
    batch_size: int
    seed: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    """Further coordinator settings: prox_mu, server_learning_rate, proto_lambda, ..."""


@dataclass
class ScenarioResult:
    accuracy: float
    """Test accuracy after the last round: of the global model, or mean over agents' personal models."""
    curve: list[float]
    """The same, after each training round (each epoch, centralised)."""
    validation: float | None = None
    """Agents' held-out accuracy in the final evaluation round (what tuning may look at)."""
    upload_bytes: float | None = None
    """Mean size of an accepted update: bytes uploaded per agent per round."""
    extra: dict[str, float] = field(default_factory=dict)
    extra_curves: dict[str, list[float]] = field(default_factory=dict)
    skew: list[ClientSummary] = field(default_factory=list)
    wall_s: float = 0.0
    failed_rounds: int = 0


def label_skew(fleet: FleetConfig) -> list[ClientSummary]:
    """Per agent: samples, classes and KL divergence to the pool's label distribution."""
    pool, _ = pool_and_test(resolve_task(fleet.task), fleet.data, fleet.data_seed)
    parts = make_partition(fleet.partition, pool.y, fleet.agents, fleet.data_seed, alpha=fleet.alpha,
                           classes_per_client=fleet.classes_per_client, samples_per_class=fleet.samples_per_class)
    return summarize(pool.y, parts, pool.num_classes)


def centralised(family: str, train: TrainConfig, epochs: int, workdir: Path, data: str | None = None,
                data_seed: int = 0, task: str = "digits") -> ScenarioResult:
    """The upper bound: one model trained on the whole pool, with the agents' training loop."""
    started = time.perf_counter()
    run_task = resolve_task(task)
    pool, test = pool_and_test(run_task, data, data_seed)
    model = run_task.build_model(family, seed=train.seed)
    plan = LocalTraining(epochs=1, learning_rate=train.learning_rate, momentum=train.momentum or 0.0)
    hooks = FedAvgClient({}, AgentStateDir(workdir), RoundContext("central", 0, family, CPU))
    curve = []
    for epoch in range(epochs):
        train_local(model, pool, plan, train.batch_size, CPU, hooks, seed=train.seed * 100_003 + epoch,
                    objective=run_task.objective)
        curve.append(_accuracy(evaluate(model, test, CPU, run_task.objective).accuracy))
    return ScenarioResult(curve[-1], curve, wall_s=time.perf_counter() - started)


def federated(fleet: FleetConfig, train: TrainConfig, broker_url: str, workdir: Path, federation: str,
              score: Literal["global", "personal"], timeout_s: float = 3600.0) -> ScenarioResult:
    """A federation of ``fleet`` agents trained by ``train``; scored after every round.

    ``global``: each family's global model on the whole test split (one family expected).
    ``personal``: each agent's personal model (FedProto) on the test samples of its own
    classes, by its head and by the nearest global prototype; the mean over agents.
    """
    task = resolve_task(fleet.task)
    _, test = pool_and_test(task, fleet.data, fleet.data_seed)
    agents = _agent_settings(fleet, broker_url, workdir, federation)
    coordinator = CoordinatorSettings(
        federation=federation, broker_url=broker_url, state_dir=workdir / "coordinator",
        task=coordinator_task(task, workdir), algorithm=train.algorithm,
        rounds=train.rounds, fraction_fit=train.fraction, min_fit_agents=1, min_available_agents=fleet.agents,
        local_epochs=train.local_epochs, learning_rate=train.learning_rate, momentum=train.momentum,
        batch_size=train.batch_size, seed=train.seed, init_seed=train.seed, round_deadline_s=timeout_s,
        agent_timeout_s=timeout_s, quorum_fraction=1.0, **train.params,
    )
    curves: dict[str, list[float]] = {}
    observe = (_GlobalScore(test, task, curves) if score == "global"
               else _PersonalScore(test, task, agents, curves))
    started = time.perf_counter()
    result = run_federation(coordinator, agents, timeout_s=timeout_s, on_round_closed=observe)
    trained = [r for r in result.history if r.task == "train"]
    answered = sum(r.answered for r in trained)
    final = result.history[-1]
    main = curves.pop("accuracy")
    return ScenarioResult(
        accuracy=main[-1], curve=main, validation=final.accuracy if final.task == "evaluate" else None,
        upload_bytes=sum(r.bytes_in for r in trained) / answered if answered else None,
        extra={name: curve[-1] for name, curve in curves.items()}, extra_curves=curves, skew=label_skew(fleet),
        wall_s=time.perf_counter() - started, failed_rounds=sum(r.outcome != "completed" for r in result.history),
    )


def coordinator_task(task: Task, workdir: Path) -> str:
    """The coordinator's ``task`` setting for agents of ``task``: a built-in task's name, else a card file in ``workdir``."""
    if BUILTIN_CARDS.get(task.name) == task.card:
        return task.name
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "task-card.json"
    path.write_text(task.card.to_json())
    return str(path)


def _accuracy(value: float | None) -> float:
    """A score's accuracy; these experiments compare classifiers, a task without accuracy has nothing to compare."""
    if value is None:
        raise ValueError("the scenarios score accuracy: the task reports none (a regression task?)")
    return value


def _agent_settings(fleet: FleetConfig, broker_url: str, workdir: Path, federation: str) -> list[AgentSettings]:
    out = []
    for i in range(fleet.agents):
        device = fleet.devices[i % len(fleet.devices)]
        out.append(AgentSettings(
            federation=federation, broker_url=broker_url, device=device, agent_id=f"{device}-{i}",  # type: ignore[arg-type]
            state_dir=workdir / "agents" / f"{device}-{i}", task=fleet.task, family=fleet.family, data=fleet.data,
            partition=fleet.partition, num_partitions=fleet.agents, partition_index=i, alpha=fleet.alpha,  # type: ignore[arg-type]
            classes_per_client=fleet.classes_per_client, samples_per_class=fleet.samples_per_class,
            data_seed=fleet.data_seed, heartbeat_s=30.0,
        ))
    return out


class _GlobalScore:
    """After each training round: the global model's accuracy on the test split."""

    def __init__(self, test: Dataset, task: Task, curves: dict[str, list[float]]) -> None:
        self.test = test
        self.task = task
        self.curves = curves
        curves["accuracy"] = []

    def __call__(self, summary: RoundSummary, engine: RoundEngine) -> None:
        if summary.task != "train":
            return
        states = engine.strategy.states
        if len(states) != 1:
            raise ValueError(f"global scoring expects one model family, the run has {sorted(states)}")
        family, state = next(iter(states.items()))
        self.curves["accuracy"].append(_accuracy(score_weights(family, state.weights, self.test, self.task).accuracy))


class _PersonalScore:
    """After each training round: every agent's personal model on the test samples of its classes."""

    def __init__(self, test: Dataset, task: Task, agents: list[AgentSettings], curves: dict[str, list[float]]) -> None:
        self.task = task
        self.curves = curves
        self.agents = []
        for settings in agents:
            local = build_local_data(task, settings.data, partition=settings.partition,
                                     num_partitions=settings.num_partitions, partition_index=settings.partition_index,
                                     alpha=settings.alpha, classes_per_client=settings.classes_per_client,
                                     samples_per_class=settings.samples_per_class,
                                     data_seed=settings.data_seed)
            mine = np.isin(test.y, np.unique(local.train.y))
            family = settings.family or task.family_for(settings.device)
            self.agents.append((settings.state_dir, family, test.subset(np.flatnonzero(mine))))
        for name in ("accuracy", "proto_accuracy"):
            curves[name] = []

    def __call__(self, summary: RoundSummary, engine: RoundEngine) -> None:
        if summary.task != "train":
            return
        strategy = engine.strategy
        prototypes, counts = getattr(strategy, "prototypes", None), getattr(strategy, "counts", None)
        normalize = bool(getattr(strategy, "normalize", False))
        heads, protos, by_family = [], [], {}
        for state_dir, family, test in self.agents:
            model = self.task.build_model(family, seed=engine.settings.init_seed)
            personal = AgentStateDir(state_dir).read_arrays(personal_model_name(engine.run.run_id, family))
            if personal is not None:
                set_arrays(model, personal)
            embeddings, logits = embed_all(model, test, CPU, normalize)
            labels = torch.from_numpy(test.y)
            heads.append((logits.argmax(1) == labels).float().mean().item())
            by_family.setdefault(family, []).append(heads[-1])
            if prototypes is not None and counts is not None:
                known = torch.from_numpy(counts > 0)
                predicted = nearest_prototype(embeddings, torch.from_numpy(prototypes), known)
                protos.append((predicted == labels).float().mean().item())
        self.curves["accuracy"].append(float(np.mean(heads)))
        self.curves["proto_accuracy"].append(float(np.mean(protos)) if protos else float("nan"))
        for family, accuracies in by_family.items():
            self.curves.setdefault(f"accuracy {family}", []).append(float(np.mean(accuracies)))
