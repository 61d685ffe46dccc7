"""One round of DP-SGD: clipping and noise really applied, steps as charged, hooks in the right order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.algorithms.base import ClientAlgorithm, RoundContext
from edge_agent.algorithms.fedavg import FedAvgClient
from edge_agent.data.datasets import load_digits
from edge_agent.models import FedModel, build_model
from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.dp_training import RoundShape, train_private
from edge_agent.privacy.errors import BudgetExhausted, PrivacyUnsupported
from edge_agent.privacy.ledger import PrivacyLedger
from edge_agent.privacy.trainer import PrivateTrainer
from edge_agent.state import AgentStateDir
from edge_agent.training import train_local
from edge_agent.weights import get_arrays
from protocol.messages import LocalTraining

PLAN = LocalTraining(epochs=1, learning_rate=0.5)
CPU = torch.device("cpu")
CONTEXT = RoundContext("run1", 1, "mlp_tiny", CPU)


@pytest.fixture(scope="module")
def data():
    pool, _ = load_digits()
    return pool.subset(np.arange(120), "digits-120")


def model() -> FedModel:
    return build_model("mlp_tiny", (1, 8, 8), 10, seed=0)


def moved(before: dict[str, np.ndarray], after: FedModel) -> float:
    now = get_arrays(after)
    return float(np.sqrt(sum(((now[k] - before[k]) ** 2).sum() for k in before)))


def test_round_shape_follows_batch_size_over_records() -> None:
    shape = RoundShape.of(num_samples=120, batch_size=32, epochs=3)
    assert shape.sample_rate == pytest.approx(32 / 120)
    assert shape.steps == 11  # 3 passes of 3.75 expected steps each
    assert RoundShape.of(num_samples=144, batch_size=64, epochs=1).steps == 2
    assert RoundShape.of(num_samples=10, batch_size=64, epochs=1) == RoundShape(1.0, 1)


def test_per_sample_clipping_bounds_the_step(data) -> None:
    """With a tiny clip and no noise to speak of, each step moves at most lr * clip * batch / expected batch."""
    shape = RoundShape.of(len(data), 32, 1)
    net = model()
    before = get_arrays(net)
    clip = 1e-4
    train_private(net, data, PLAN, shape, shape.charge(1e-9), clip, CPU, FedAvgClient({}, None, CONTEXT))  # type: ignore[arg-type]
    bound = PLAN.learning_rate * clip * len(data) / 32 * shape.steps  # every record in every batch, worst case
    assert 0 < moved(before, net) <= bound
    unclipped = model()
    train_local(unclipped, data, PLAN, 32, CPU, FedAvgClient({}, None, CONTEXT), seed=0)  # type: ignore[arg-type]
    assert moved(before, unclipped) > 100 * bound


def test_noise_is_added_with_the_charged_multiplier(data) -> None:
    """Clip to almost nothing: what moves the weights is noise of std sigma * clip / expected batch per step."""
    shape = RoundShape.of(len(data), 32, 1)
    net = model()
    before = get_arrays(net)
    sigma, clip = 50.0, 1e-3
    train_private(net, data, PLAN, shape, shape.charge(sigma), clip, CPU, FedAvgClient({}, None, CONTEXT))  # type: ignore[arg-type]
    params = sum(p.numel() for p in net.parameters())
    expected = PLAN.learning_rate * sigma * clip / 32 * np.sqrt(shape.steps * params)
    assert moved(before, net) == pytest.approx(expected, rel=0.1)


def test_hooks_are_removed_so_the_next_round_can_wrap_again(data) -> None:
    shape = RoundShape.of(len(data), 32, 1)
    net = model()
    for _ in range(2):  # Opacus refuses to hook a module twice: a leftover hook would fail here
        train_private(net, data, PLAN, shape, shape.charge(1.0), 1.0, CPU, FedAvgClient({}, None, CONTEXT))  # type: ignore[arg-type]
    assert not hasattr(net, "autograd_grad_sample_hooks")
    assert not any(hasattr(p, "grad_sample") for p in net.parameters())


class RecordingCorrection(FedAvgClient):
    """Records the gradient after_backward sees (a SCAFFOLD-like correction would edit it here)."""

    name = "recording"

    def __init__(self) -> None:
        super().__init__({}, None, CONTEXT)  # type: ignore[arg-type]
        self.norms: list[float] = []

    def after_backward(self, model: FedModel) -> None:
        self.norms.append(float(torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))))


def test_after_backward_sees_the_privatised_gradient(data) -> None:
    shape = RoundShape.of(len(data), 32, 1)
    hook = RecordingCorrection()
    clip = 0.1
    train_private(model(), data, PLAN, shape, shape.charge(1000.0), clip, CPU, hook)
    # Clipped, the data's part is at most clip * batch / expected batch (~0.1); the noise is ~1000x that.
    assert len(hook.norms) == shape.steps and min(hook.norms) > 100 * clip


class ProximalInTheLoss(FedAvgClient):
    """A FedProx-style term on the weights themselves, wrongly placed in extra_loss."""

    name = "proximal-in-loss"

    def __init__(self) -> None:
        super().__init__({}, None, CONTEXT)  # type: ignore[arg-type]
        self.anchor: list[torch.Tensor] | None = None

    def extra_loss(self, model, embeddings, logits, labels):
        if self.anchor is None:
            self.anchor = [p.detach().clone() + 0.1 for p in model.parameters()]
        return 0.5 * sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), self.anchor, strict=True))


def test_a_weight_term_in_the_loss_is_refused_not_silently_dropped(data) -> None:
    shape = RoundShape.of(len(data), 32, 1)
    with pytest.raises(PrivacyUnsupported, match="after_backward"):
        train_private(model(), data, PLAN, shape, shape.charge(1.0), 1.0, CPU, ProximalInTheLoss())


class AlignToPrototypes(FedAvgClient):
    """A FedProto-style term: per sample, through the forward pass. Allowed under DP."""

    name = "align"

    def extra_loss(self, model, embeddings, logits, labels):
        return 0.1 * embeddings.pow(2).sum(1).mean()


def test_a_per_sample_term_in_the_loss_is_allowed(data) -> None:
    shape = RoundShape.of(len(data), 32, 1)
    result = train_private(model(), data, PLAN, shape, shape.charge(1.0), 1.0, CPU,
                           AlignToPrototypes({}, None, CONTEXT))  # type: ignore[arg-type]
    assert result.steps == shape.steps


def test_trainer_charges_before_training_and_refuses_past_the_budget(tmp_path: Path, data) -> None:
    config = DPConfig(noise_multiplier=1.0, budget_epsilon=100.0)
    trainer = PrivateTrainer.open(config, AgentStateDir(tmp_path))
    trainer.train(model(), data, PLAN, 32, CPU, FedAvgClient({}, None, CONTEXT))  # type: ignore[arg-type]
    one_round = trainer.spent().epsilon
    assert PrivacyLedger.open(AgentStateDir(tmp_path), config).epsilon == one_round > 0
    tight = PrivateTrainer.open(DPConfig(noise_multiplier=1.0, budget_epsilon=one_round * 1.01),
                                AgentStateDir(tmp_path))
    assert tight.ledger.exhausted and tight.spent().exhausted
    with pytest.raises(BudgetExhausted):
        tight.train(model(), data, PLAN, 32, CPU, FedAvgClient({}, None, CONTEXT))  # type: ignore[arg-type]
    assert PrivacyLedger.open(AgentStateDir(tmp_path), config).epsilon == one_round


class NotDeclared(ClientAlgorithm):
    name = "undeclared"


def test_trainer_refuses_algorithms_not_marked_dp_compatible(tmp_path: Path, data) -> None:
    trainer = PrivateTrainer.open(DPConfig(noise_multiplier=1.0), AgentStateDir(tmp_path))
    with pytest.raises(PrivacyUnsupported, match="not marked DP-compatible"):
        trainer.train(model(), data, PLAN, 32, CPU, NotDeclared({}, None, CONTEXT))  # type: ignore[arg-type]
    assert trainer.spent().epsilon == 0.0
