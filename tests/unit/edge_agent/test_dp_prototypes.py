"""FedProto's prototypes under DP: clipped, noised with the stated std, released once, and accounted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.algorithms.base import RoundContext
from edge_agent.algorithms.fedproto import FedProtoClient
from edge_agent.data.datasets import load_digits
from edge_agent.models import FedModel, build_model
from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.errors import PrivacyUnsupported
from edge_agent.privacy.ledger import Charge
from edge_agent.privacy.prototypes import PrototypeRelease
from edge_agent.privacy.trainer import PrivateTrainer
from edge_agent.state import AgentStateDir
from protocol.messages import LocalTraining

CPU = torch.device("cpu")


def test_prototypes_are_means_of_clipped_embeddings() -> None:
    embeddings = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.5]])  # norms 5, 0.5, 0.5
    labels = torch.tensor([0, 0, 2])
    prototypes, counts = PrototypeRelease(noise_multiplier=1e-9, clip=1.0).release(embeddings, labels, 3)
    assert counts.tolist() == [2, 0, 1] and counts.dtype == np.int64
    np.testing.assert_allclose(prototypes[0], [(0.6 + 0.3) / 2, (0.8 + 0.4) / 2], atol=1e-6)  # [3, 4] clipped to norm 1
    np.testing.assert_allclose(prototypes[1], [0.0, 0.0])  # no record of class 1
    np.testing.assert_allclose(prototypes[2], [0.0, 0.5], atol=1e-6)
    assert prototypes.dtype == np.float32


def test_noise_std_is_sigma_times_the_joint_sensitivity() -> None:
    sigma, clip, n = 1.5, 2.0, 40
    embeddings = torch.zeros((n, 4))
    labels = torch.zeros(n, dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    counts = [PrototypeRelease(sigma, clip).release(embeddings, labels, 1, gen)[1][0] for _ in range(3000)]
    # Counts carry noise of std sigma * sqrt(2) * clip / clip; rounding adds 1/12 to the variance.
    assert np.mean(counts) == pytest.approx(n, abs=0.15)
    assert np.std(counts) == pytest.approx(np.sqrt(2 * sigma**2 + 1 / 12), rel=0.06)


def test_a_release_happens_once_per_charge() -> None:
    release = PrototypeRelease(1.0, 1.0)
    assert release.charge() == Charge(1.0, 1.0, 1)
    release.release(torch.zeros((2, 3)), torch.tensor([0, 1]), 2)
    with pytest.raises(RuntimeError, match="already released"):
        release.release(torch.zeros((2, 3)), torch.tensor([0, 1]), 2)


def fedproto_client(state_dir: Path, model: FedModel) -> FedProtoClient:
    """The real FedProto client, as the worker sets it up for a first round."""
    client = FedProtoClient({"lambda": 1.0}, AgentStateDir(state_dir), RoundContext("run1", 1, "mlp_tiny", CPU))
    client.load(model, None)
    client.begin(model, None)
    return client


@pytest.fixture(scope="module")
def data():
    pool, _ = load_digits()
    return pool.subset(np.arange(100), "digits-100")


def test_prototype_rounds_need_the_mechanism(tmp_path: Path, data) -> None:
    trainer = PrivateTrainer.open(DPConfig(noise_multiplier=1.0), AgentStateDir(tmp_path))
    model = build_model("mlp_tiny", (1, 8, 8), 10, seed=0)
    with pytest.raises(PrivacyUnsupported, match="dp_prototype_noise_multiplier"):
        trainer.train(model, data, LocalTraining(epochs=1, learning_rate=0.1), 25, CPU,
                      fedproto_client(tmp_path / "agent", model))
    assert trainer.spent().epsilon == 0.0


def test_prototype_release_is_charged_with_the_training(tmp_path: Path, data) -> None:
    config = DPConfig(noise_multiplier=1.0, prototype_noise_multiplier=5.0, prototype_clip=1.0)
    trainer = PrivateTrainer.open(config, AgentStateDir(tmp_path))
    model = build_model("mlp_tiny", (1, 8, 8), 10, seed=0)
    client = fedproto_client(tmp_path / "agent", model)
    plan = LocalTraining(epochs=1, learning_rate=0.1)
    result = trainer.train(model, data, plan, 25, CPU, client)
    payload = client.payload(model, data, result, plan)
    # Counts are released with noise of std ~7 per class (OS-seeded): their sum is only roughly the 100 samples.
    assert payload["prototypes"].shape == (10, 64) and payload["prototype_counts"].sum() > 0
    assert trainer.ledger.history == [(1.0, 0.25, 4), (5.0, 1.0, 1)]
    training_only = trainer.ledger.__class__("rdp", 1e-5, None).epsilon_with([Charge(1.0, 0.25, 4)])
    assert trainer.spent().epsilon > training_only
