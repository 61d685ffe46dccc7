"""Helpers for the state-file tests (found in review): a real LocalWorker (digits, mlp_tiny, a few samples), DP on or off."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edge_agent.algorithms.base import parameter_names
from edge_agent.models import build_model
from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.trainer import PrivateTrainer
from edge_agent.state import AgentStateDir
from edge_agent.worker import LocalWorker
from tests.unit.edge_agent.rounds import AGENT, RUN, TASK, announce, digits_subset, global_state, global_weights

FAMILY = "mlp_tiny"


def dp_worker(state_dir: Path, *, budget: float | None = 50.0, noise: float = 1.0) -> LocalWorker:
    data = digits_subset(per_class=3)
    state = AgentStateDir(state_dir)
    privacy = PrivateTrainer.open(DPConfig(noise_multiplier=noise, budget_epsilon=budget), state)
    return LocalWorker(AGENT, TASK, FAMILY, data, torch.device("cpu"), batch_size=8, state=state, privacy=privacy)


def plain_worker(state_dir: Path) -> LocalWorker:
    return LocalWorker(AGENT, TASK, FAMILY, digits_subset(per_class=3), torch.device("cpu"), batch_size=8,
                       state=AgentStateDir(state_dir))


def param_names() -> list[str]:
    data = digits_subset(per_class=3)
    return parameter_names(build_model(FAMILY, data.train.in_shape, 10, seed=0))


def scaffold_state(round_number: int):
    weights = global_weights(FAMILY)
    control = {n: np.zeros_like(weights[n]) for n in param_names()}
    return global_state(FAMILY, round_number, weights=weights, control=control)


def scaffold_round(round_number: int, run_id: str = RUN):
    state = scaffold_state(round_number)
    return announce("scaffold", round_number, state, momentum=0.0, epochs=1, run_id=run_id), state


def epsilon(worker: LocalWorker) -> float:
    spent = worker.privacy_spent()
    assert spent is not None
    return spent.epsilon
