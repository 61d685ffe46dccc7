"""Helpers that drive a real LocalWorker through rounds without a broker."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from edge_agent.data.datasets import load_digits
from edge_agent.data.local import LocalData
from edge_agent.data.sources.report import LoadReport
from edge_agent.state import AgentStateDir
from edge_agent.tasks.registry import resolve_task
from edge_agent.weights import get_arrays
from edge_agent.worker import LocalWorker
from protocol.messages import GlobalState, LocalTraining, RoundAnnouncement, StateRef
from tests.task_refs import family_layouts

RUN = "run-1"
AGENT = "agent-0"
TASK = resolve_task("digits")


def digits_subset(classes: list[int] | None = None, per_class: int = 12, seed: int = 0) -> LocalData:
    """A small slice of the digits: ``per_class`` training and 3 held-out images of each class."""
    pool, _ = load_digits()
    rng = np.random.default_rng(seed)
    train, held = [], []
    for c in classes if classes is not None else range(10):
        members = rng.permutation(np.flatnonzero(pool.y == c))
        train.append(members[:per_class])
        held.append(members[per_class:per_class + 3])
    return LocalData(pool.subset(np.sort(np.concatenate(train))), pool.subset(np.sort(np.concatenate(held))),
                     LoadReport())


def make_worker(state_dir: Path, data: LocalData, family: str = "cnn_small", agent_id: str = AGENT) -> LocalWorker:
    return LocalWorker(agent_id, TASK, family, data, torch.device("cpu"), batch_size=16, state=AgentStateDir(state_dir))


def global_weights(family: str, seed: int = 7) -> dict[str, np.ndarray]:
    return get_arrays(TASK.build_model(family, seed=seed))


def global_state(family: str, round_number: int, *, weights: dict[str, np.ndarray] | None = None,
                 control: dict[str, np.ndarray] | None = None, prototypes: np.ndarray | None = None,
                 counts: np.ndarray | None = None, run_id: str = RUN) -> GlobalState:
    weights, control = weights or {}, control or {}
    return GlobalState(run_id=run_id, family=family, round=round_number, weights=weights, control=control,
                       prototypes=prototypes, prototype_counts=counts,
                       digest=GlobalState.compute_digest(weights, control, prototypes, counts))


def announce(algorithm: str, round_number: int, state: GlobalState | None = None, *, params: dict | None = None,
             momentum: float = 0.9, epochs: int = 2, learning_rate: float = 0.05, task: str = "train",
             run_id: str = RUN, selected: list[str] | None = None) -> RoundAnnouncement:
    """A round of the digits task, announcing every digits family's layout (as for a fleet of all three)."""
    states = {} if state is None else {state.family: StateRef(family=state.family, round=state.round,
                                                                digest=state.digest)}
    return RoundAnnouncement(
        run_id=run_id, round=round_number, task=task, task_ref=TASK.card.ref,  # type: ignore[arg-type]
        layouts=family_layouts(TASK.families), algorithm=algorithm,  # type: ignore[arg-type]
        training=LocalTraining(epochs=epochs, learning_rate=learning_rate, momentum=momentum),
        params=params or {}, selected=selected or [AGENT], states=states, init_seed=0, issued_at=time.time(),
        deadline_s=60.0, last_round=10,
    )
