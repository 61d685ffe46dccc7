"""SCAFFOLD's arithmetic, step by step, against an independent reference of the paper's algorithm.

Karimireddy et al. (ICML 2020), Algorithm 1 with option II, on a convex problem: least squares
per client, with uneven sample counts (so each client takes a different number ``K_i`` of local
mini-batch steps) and partial participation (clients first selected in different rounds, so
starting from ``c_i = 0``, others skipping rounds, one never selected but known). Per round,
for each selected client i:

    y <- y - lr * (g_i(y) + c - c_i)                       K_i times
    c_i+ = c_i - c + (x - y) / (K_i * lr)
    dy_i = y - x,  dc_i = c_i+ - c_i

and on the server, N being every client known (not only those selected):

    x <- x + lr_g * sum_S p_i dy_i / sum_S p_i
    c <- c + (|S| / N) * sum_S p_i dc_i / sum_S p_i

The paper's objective weighs clients equally (p_i = 1). The project's objective weighs them by
sample count (p_i = n_i, as FedAvg does); the reference takes p_i as a parameter, and the two
coincide when counts are equal. Both means must use the same p_i: ``c`` estimates the gradient
of the objective the ``x`` step descends, and with different weights the fixed point is the
optimum of the other objective (the last test pins which one SCAFFOLD reaches).

The project runs here for real: the agent's ScaffoldClient hooks inside ``train_local`` (the
agents' training loop and SGD), its variates persisted in a state directory, real Update and
GlobalState messages, and the coordinator's Scaffold strategy. Only the batch order is taken
from the run (recorded through the hooks), so that the reference samples what the agent did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from coordinator.aggregation import weighted_mean
from coordinator.strategies import Scaffold
from edge_agent.algorithms import RoundContext, build_client_algorithm
from edge_agent.algorithms.base import ClientAlgorithm
from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.state import AgentStateDir
from edge_agent.tasks.base import Objective
from edge_agent.training import train_local
from protocol.messages import LocalTraining, TrainMetrics, Update
from tests.task_refs import DIGITS

RUN, FAMILY, DIM = "reference", "linear", 3
SAMPLES = (5, 9, 14, 23, 40)
"""Per client; with batches of 4 over 2 epochs, K_i = 4, 6, 8, 12, 20 steps."""
KNOWN = len(SAMPLES) + 1
"""N: the coordinator also knows a client that is never selected."""
SCHEDULE = ([0, 1], [2, 3, 4], [1, 4], [0, 2], [3], [0, 1, 2, 3, 4], [4, 2])
"""Clients selected per round: 2, 3 and 4 start from c_i = 0 in rounds 2 and 3; most skip rounds."""
BATCH, EPOCHS = 4, 2
WEIGHT_NAME, BIAS_NAME = "features.weight", "features.bias"


def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((outputs[:, 0] - targets) ** 2).mean()


LEAST_SQUARES = Objective(loss=squared_error, metrics=lambda outputs, targets: {})


def client_data(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Inputs [n, DIM] and distinct targets [n]; each client has its own true weights (drift)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(SAMPLES):
        a = rng.normal(loc=i - 2.0, scale=1.0, size=(n, DIM))
        truth = rng.normal(size=DIM) * 2.0
        out.append((a, a @ truth + 1.5 * i + 0.1 * rng.normal(size=n)))
    return out


def pack(weights: dict[str, np.ndarray]) -> np.ndarray:
    """The project's named arrays as the reference's vector [w (DIM), b]."""
    return np.concatenate([weights[WEIGHT_NAME].reshape(-1), weights[BIAS_NAME].reshape(-1)]).astype(np.float64)


def linear_model() -> FedModel:
    model = FedModel.whole(nn.Linear(DIM, 1), num_outputs=1).double()
    with torch.no_grad():
        model.features.weight.copy_(torch.tensor([[0.3, -0.2, 0.1]], dtype=torch.float64))
        model.features.bias.fill_(0.5)
    return model


# -- the reference, from the paper's equations only ---------------------------------------
def gradient(v: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Of 0.5 * mean((a w + bias - b)^2) with respect to v = [w, bias]."""
    residual = a @ v[:DIM] + v[DIM] - b
    return np.concatenate([a.T @ residual, [residual.sum()]]) / len(b)


def reference_client(x: np.ndarray, c: np.ndarray, c_i: np.ndarray, a: np.ndarray, b: np.ndarray,
                     batches: list[list[int]], lr: float, weight_decay: float,
                     momentum: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(dy_i, dc_i) of one client's round; ``weight_decay`` is part of f_i's gradient.

    With ``momentum`` (outside the paper, as NIID-Bench runs it) the heavy-ball buffer takes the raw
    gradient and the correction moves y after the step; at 0 this is the paper's step."""
    y = x.copy()
    velocity = np.zeros_like(x)
    for batch in batches:
        velocity = momentum * velocity + gradient(y, a[batch], b[batch]) + weight_decay * y
        y = y - lr * velocity - lr * (c - c_i)
    steps = len(batches)
    new_c_i = c_i - c + (x - y) / (steps * lr)
    return y - x, new_c_i - c_i


def reference_server(x: np.ndarray, c: np.ndarray, dy: list[np.ndarray], dc: list[np.ndarray],
                     p: list[float], known: int, server_lr: float) -> tuple[np.ndarray, np.ndarray]:
    share = np.asarray(p, np.float64) / sum(p)
    return (x + server_lr * sum(s * d for s, d in zip(share, dy, strict=True)),
            c + len(dy) / known * sum(s * d for s, d in zip(share, dc, strict=True)))


# -- the project, through the agents' training loop -----------------------------------------
@dataclass
class Recording:
    """Training hooks that pass everything to the real client and note which samples each step used."""

    client: ClientAlgorithm
    index_of: dict[float, int]
    batches: list[list[int]] = field(default_factory=list)

    @property
    def absent_class_scale(self) -> float:
        return self.client.absent_class_scale

    def extra_loss(self, model: FedModel, embeddings: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor | None:
        self.batches.append([self.index_of[v] for v in labels.tolist()])
        return self.client.extra_loss(model, embeddings, logits, labels)

    def after_backward(self, model: FedModel) -> None:
        self.client.after_backward(model)

    def after_step(self, model: FedModel) -> None:
        self.client.after_step(model)


def project_client(agent: int, round_number: int, strategy: Scaffold, plan: LocalTraining,
                   data: tuple[np.ndarray, np.ndarray], state_dir: Path) -> tuple[Update, list[list[int]]]:
    a, b = data
    context = RoundContext(RUN, round_number, FAMILY, torch.device("cpu"))
    client = build_client_algorithm("scaffold", {}, AgentStateDir(state_dir / f"agent-{agent}"), context)
    message = strategy.states[FAMILY].message(RUN, FAMILY)
    model = linear_model()
    client.load(model, message)
    client.check_plan(plan)
    client.begin(model, message)
    train = Dataset(a, b, 0, f"client-{agent}")
    hooks = Recording(client, {float(v): j for j, v in enumerate(b)})
    result = train_local(model, train, plan, BATCH, torch.device("cpu"), hooks, seed=1000 * round_number + agent,
                         objective=LEAST_SQUARES)
    assert result.steps == len(hooks.batches) == EPOCHS * math.ceil(len(b) / BATCH)
    payload = client.payload(model, train, result, plan)
    client.commit()
    update = Update(run_id=RUN, agent_id=f"agent-{agent}", round=round_number, task="train", task_ref=DIGITS,
                    family=FAMILY, base_digest=message.digest, num_samples=len(b),
                    metrics=TrainMetrics(train_loss=result.loss), **payload)
    return update, hooks.batches


def start(strategy: Scaffold) -> None:
    weights = {name: value.detach().numpy().copy() for name, value in linear_model().state_dict().items()}
    strategy.states[FAMILY] = strategy.new_state(1, weights, {name: np.zeros_like(v) for name, v in weights.items()})


@pytest.mark.parametrize(("learning_rate", "weight_decay", "server_lr", "momentum"),
                         [(0.02, 0.0, 1.0, 0.0), (0.01, 0.05, 0.7, 0.0), (0.005, 0.05, 1.0, 0.9)],
                         ids=["plain", "weight-decay-and-server-rate", "momentum"])
def test_every_round_matches_the_reference(tmp_path: Path, learning_rate: float, weight_decay: float,
                                           server_lr: float, momentum: float) -> None:
    data = client_data()
    strategy = Scaffold(weighted_mean, server_learning_rate=server_lr)
    start(strategy)
    plan = LocalTraining(epochs=EPOCHS, learning_rate=learning_rate, momentum=momentum, weight_decay=weight_decay)
    x, c = pack(strategy.states[FAMILY].weights), np.zeros(DIM + 1)
    variates = [np.zeros(DIM + 1) for _ in SAMPLES]
    for round_number, chosen in enumerate(SCHEDULE, start=1):
        updates, dy, dc = [], [], []
        for agent in chosen:
            update, batches = project_client(agent, round_number, strategy, plan, data[agent], tmp_path)
            ref_dy, ref_dc = reference_client(x, c, variates[agent], *data[agent], batches, learning_rate, weight_decay,
                                              momentum)
            np.testing.assert_allclose(pack(update.delta), ref_dy, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(pack(update.control_delta), ref_dc, rtol=1e-9, atol=1e-12)
            variates[agent] = variates[agent] + ref_dc
            assert strategy.check_update(update) is None
            updates.append(update)
            dy.append(ref_dy)
            dc.append(ref_dc)
        assert strategy.aggregate(round_number, updates, population={FAMILY: KNOWN}) == []
        x, c = reference_server(x, c, dy, dc, [SAMPLES[i] for i in chosen], KNOWN, server_lr)
        state = strategy.states[FAMILY]
        np.testing.assert_allclose(pack(state.weights), x, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(pack(state.control), c, rtol=1e-9, atol=1e-12)


def test_the_server_variate_is_the_weighted_mean_of_every_clients_variate(tmp_path: Path) -> None:
    """The invariant the |S|/N step keeps when counts are equal: c = sum_i p_i c_i over all N clients.
    With full participation it holds exactly for any counts."""
    data = client_data()
    strategy = Scaffold(weighted_mean)
    start(strategy)
    plan = LocalTraining(epochs=EPOCHS, learning_rate=0.02, momentum=0.0)
    variates = [np.zeros(DIM + 1) for _ in SAMPLES]
    everyone = list(range(len(SAMPLES)))
    for round_number in range(1, 4):
        updates = [project_client(i, round_number, strategy, plan, data[i], tmp_path)[0] for i in everyone]
        for i, update in enumerate(updates):
            variates[i] = variates[i] + pack(update.control_delta)
        assert strategy.aggregate(round_number, updates, population={FAMILY: len(SAMPLES)}) == []
        expected = np.average(variates, axis=0, weights=SAMPLES)
        np.testing.assert_allclose(pack(strategy.states[FAMILY].control), expected, rtol=1e-9, atol=1e-12)


def test_scaffold_reaches_the_pooled_least_squares_optimum(tmp_path: Path) -> None:
    """The fixed point of the weighted algorithm is the optimum of sum_i n_i f_i, the pooled data's
    least squares (what FedAvg aims at, and what a test split drawn from the pool scores), not the
    optimum of the clients' unweighted mean (the other answer when counts are uneven)."""
    data = client_data()
    features = np.concatenate([np.hstack([a, np.ones((len(a), 1))]) for a, _ in data])
    targets = np.concatenate([b for _, b in data])
    pooled, *_ = np.linalg.lstsq(features, targets, rcond=None)
    unweighted = np.linalg.solve(sum(np.hstack([a, np.ones((len(a), 1))]).T @ np.hstack([a, np.ones((len(a), 1))]) / len(b)
                                     for a, b in data),
                                 sum(np.hstack([a, np.ones((len(a), 1))]).T @ b / len(b) for a, b in data))
    assert np.linalg.norm(pooled - unweighted) > 0.1  # the two objectives disagree on this problem
    strategy = Scaffold(weighted_mean)
    start(strategy)
    plan = LocalTraining(epochs=EPOCHS, learning_rate=0.01, momentum=0.0)
    everyone = list(range(len(SAMPLES)))
    for round_number in range(1, 151):
        updates = [project_client(i, round_number, strategy, plan, data[i], tmp_path)[0] for i in everyone]
        assert strategy.aggregate(round_number, updates, population={FAMILY: len(SAMPLES)}) == []
    reached = pack(strategy.states[FAMILY].weights)
    # Mini-batch noise keeps x a little off the optimum; the other objective's is 25 times farther.
    assert np.linalg.norm(reached - pooled) < 0.1 * np.linalg.norm(pooled - unweighted), (reached, pooled, unweighted)
