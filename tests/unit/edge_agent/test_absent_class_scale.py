"""SCAFFOLD's ``absent_class_scale``: the training loss scales the logits of the classes an agent holds none of.

It is announced by the coordinator, validated by the agent, applied in local training only (never when scoring
accuracy), and refused under DP, where a loss shaped by which classes the private data holds is not covered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from edge_agent.algorithms import RoundContext
from edge_agent.algorithms.fedavg import FedAvgClient
from edge_agent.algorithms.scaffold import ScaffoldClient
from edge_agent.data.datasets import Dataset
from edge_agent.models import build_model
from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.errors import PrivacyUnsupported
from edge_agent.privacy.trainer import PrivateTrainer
from edge_agent.state import AgentStateDir
from edge_agent.training import absent_class_factors, train_local
from protocol.errors import ProtocolError
from protocol.messages import LocalTraining
from tests.unit.edge_agent.rounds import digits_subset

CPU = torch.device("cpu")
FAMILY = "mlp_tiny"


def scaffold(tmp_path: Path, params: dict) -> ScaffoldClient:
    return ScaffoldClient(params, AgentStateDir(tmp_path), RoundContext("run1", 1, FAMILY, CPU))


def test_the_factors_are_one_for_held_classes_and_the_scale_for_the_others() -> None:
    data = Dataset(np.zeros((3, 1, 8, 8), np.float32), np.array([2, 0, 2]), 4, "two classes")
    assert absent_class_factors(data, 0.5, CPU).tolist() == [1.0, 0.5, 1.0, 0.5]
    assert absent_class_factors(data, 1.0, CPU) is None  # the default: the loss untouched
    regression = Dataset(np.zeros((2, 3), np.float32), np.array([0.5, 1.5], np.float32), 0, "values")
    assert absent_class_factors(regression, 0.5, CPU) is None


def test_a_step_descends_the_cross_entropy_of_the_scaled_logits(tmp_path: Path) -> None:
    """One full-batch step at momentum 0 from a first round (c = c_i = 0, so no correction): the weights move by
    -lr times the gradient of CE(logits x factors), computed here by autograd on a copy of the model."""
    train = digits_subset(classes=[3, 7], per_class=8).train
    plan = LocalTraining(epochs=1, learning_rate=0.1, momentum=0.0, steps=1)
    factors = torch.tensor([0.25 if c not in (3, 7) else 1.0 for c in range(10)])
    expected = build_model(FAMILY, train.in_shape, 10, seed=0)
    F.cross_entropy(expected(torch.from_numpy(train.x)) * factors, torch.from_numpy(train.y)).backward()
    plain = build_model(FAMILY, train.in_shape, 10, seed=0)
    moved = {}
    for scale, model in ((0.25, build_model(FAMILY, train.in_shape, 10, seed=0)), (1.0, plain)):
        client = scaffold(tmp_path / str(scale), {"absent_class_scale": scale})
        client.check_plan(plan)
        client.begin(model, None)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_local(model, train, plan, len(train), CPU, client, seed=0)
        moved[scale] = {n: before[n] - p.detach() for n, p in model.named_parameters()}
    for name, p in expected.named_parameters():
        torch.testing.assert_close(moved[0.25][name], 0.1 * p.grad, rtol=1e-4, atol=1e-7)
    # The head rows of the classes it lacks are pushed down less than plain cross-entropy pushes them.
    absent = [c for c in range(10) if c not in (3, 7)]
    assert moved[0.25]["head.weight"][absent].norm() < moved[1.0]["head.weight"][absent].norm()


@pytest.mark.parametrize("scale", [0.0, -0.5, 1.5, "half"])
def test_a_scale_outside_zero_to_one_is_refused_naming_it(tmp_path: Path, scale: object) -> None:
    with pytest.raises(ProtocolError, match="absent_class_scale"):
        scaffold(tmp_path, {"absent_class_scale": scale})


def test_dp_training_refuses_a_scaled_loss_before_charging_the_budget(tmp_path: Path) -> None:
    train = digits_subset(classes=[3, 7], per_class=8).train
    trainer = PrivateTrainer.open(DPConfig(noise_multiplier=1.0), AgentStateDir(tmp_path / "dp"))
    model = build_model(FAMILY, train.in_shape, 10, seed=0)
    with pytest.raises(PrivacyUnsupported, match="absent_class_scale"):
        trainer.train(model, train, LocalTraining(epochs=1, learning_rate=0.1), 8, CPU, scaffold(tmp_path, {"absent_class_scale": 0.5}))
    assert trainer.spent().epsilon == 0.0
    assert FedAvgClient({}, AgentStateDir(tmp_path), RoundContext("run1", 1, FAMILY, CPU)).absent_class_scale == 1.0
