"""SCAFFOLD against FedAvg on a deterministic client-drift problem.

Three linear-regression clients with different slopes, intercepts and shifted inputs; each
round every selected client takes 25 full-batch SGD steps. FedAvg's fixed point is pulled
towards the clients' own optima (client drift); SCAFFOLD's correction removes the drift and
lands on the centralised least-squares optimum. Both run the real agent-side algorithm code
(load, begin, after_backward, after_step, payload), real Update and GlobalState messages, and the real
server strategies; only the loss (squared error instead of cross-entropy) is the test's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from coordinator.aggregation import weighted_mean
from coordinator.strategies import FedAvg, Scaffold, Strategy
from edge_agent.algorithms import RoundContext, build_client_algorithm
from edge_agent.state import AgentStateDir
from edge_agent.training import TrainResult
from protocol.messages import LocalTraining, TrainMetrics, Update
from tests.task_refs import DIGITS

RUN, FAMILY = "drift", "linear"
SLOPES, INTERCEPTS, SHIFTS = (1.0, -2.0, 3.0), (0.5, -1.0, 2.0), (-2.0, 0.0, 2.5)
STEPS, LEARNING_RATE, ROUNDS = 25, 0.02, 40


class Line(nn.Module):
    """y = w x + b, with an integer buffer that must stay out of the control variates."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.b = nn.Parameter(torch.zeros(1))
        self.register_buffer("steps_seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x + self.b


def client_data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    grid = torch.linspace(-1.0, 1.0, 21)
    return [(shift + grid, slope * (shift + grid) + intercept)
            for slope, intercept, shift in zip(SLOPES, INTERCEPTS, SHIFTS, strict=True)]


def centralised_optimum() -> np.ndarray:
    x = torch.cat([x for x, _ in client_data()]).double().numpy()
    y = torch.cat([y for _, y in client_data()]).double().numpy()
    solution, *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], axis=1), y, rcond=None)
    return solution


def local_round(algorithm: str, agent: int, round_number: int, strategy: Strategy, state_dir: Path) -> Update:
    """One agent's round, through the client algorithm hooks the worker uses."""
    x, y = client_data()[agent]
    plan = LocalTraining(epochs=1, learning_rate=LEARNING_RATE, momentum=0.0)
    context = RoundContext(RUN, round_number, FAMILY, torch.device("cpu"))
    client = build_client_algorithm(algorithm, {}, AgentStateDir(state_dir / f"agent-{agent}"), context)
    family_state = strategy.states.get(FAMILY)
    message = family_state.message(RUN, FAMILY) if family_state is not None else None
    model = Line()
    client.load(model, message)  # type: ignore[arg-type]
    client.check_plan(plan)
    client.begin(model, message)  # type: ignore[arg-type]
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    steps = STEPS if message is not None else 0  # a bootstrap proposal is the seeded model, untrained (as the worker sends it)
    loss = ((model(x) - y) ** 2).mean()
    for _ in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        client.after_backward(model)  # type: ignore[arg-type]
        optimizer.step()
        client.after_step(model)  # type: ignore[arg-type]
    model.steps_seen += steps
    result = TrainResult(loss=loss.item(), accuracy=0.0, steps=steps, duration_s=0.0)
    payload = client.payload(model, None, result, plan)  # type: ignore[arg-type]  # the data is not needed
    client.commit()
    return Update(run_id=RUN, agent_id=f"agent-{agent}", round=round_number, task="train", task_ref=DIGITS, family=FAMILY,
                  base_digest=message.digest if message is not None else None, num_samples=len(x),
                  metrics=TrainMetrics(train_loss=loss.item()), **payload)


def federate(algorithm: str, strategy: Strategy, state_dir: Path, per_round: int) -> np.ndarray:
    """Train ``ROUNDS`` rounds, ``per_round`` of the 3 agents each (round-robin); the final (w, b)."""
    for round_number in range(1, ROUNDS + 1):
        chosen = [(round_number + i) % 3 for i in range(per_round)]
        updates = [local_round(algorithm, agent, round_number, strategy, state_dir) for agent in chosen]
        for update in updates:
            strategy.check_update(update)
        assert strategy.aggregate(round_number, updates, population={FAMILY: 3}) == []
    weights = strategy.states[FAMILY].weights
    return np.array([weights["w"][0], weights["b"][0]], dtype=np.float64)


@pytest.mark.parametrize("per_round", [3, 2], ids=["full-participation", "two-of-three"])
def test_scaffold_lands_closer_to_the_centralised_optimum_than_fedavg(tmp_path: Path, per_round: int) -> None:
    optimum = centralised_optimum()
    fedavg = federate("fedavg", FedAvg(weighted_mean), tmp_path / "fedavg", per_round)
    scaffold_strategy = Scaffold(weighted_mean)
    scaffold = federate("scaffold", scaffold_strategy, tmp_path / "scaffold", per_round)
    fedavg_error = np.linalg.norm(fedavg - optimum)
    scaffold_error = np.linalg.norm(scaffold - optimum)
    assert fedavg_error > 0.1, f"the problem should make FedAvg drift (error {fedavg_error:.4f})"
    assert scaffold_error < 0.1 * fedavg_error, (scaffold_error, fedavg_error)
    # Control variates cover the parameters only, never the integer buffer.
    assert set(scaffold_strategy.states[FAMILY].control) == {"w", "b"}
    assert "steps_seen" in scaffold_strategy.states[FAMILY].weights
