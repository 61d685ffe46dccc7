"""DP-SGD's sensitivity bound needs each record's clipped gradient to depend on that record only.

Opacus (loss_reduction="mean") rescales per-sample gradients by the batch size n. FedProto's alignment term
was a mean over the batch's aligned records (A of them), so each record's gradient carried a factor n / A set by
the others: one record of a class without a global prototype doubled another's, one record moved the clipped
sum by about 2 x max_grad_norm, and the noise charged overstated the protection (about half the real sigma).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import edge_agent.privacy.dp_training as dpt
from edge_agent.algorithms.base import RoundContext
from edge_agent.algorithms.fedavg import FedAvgClient
from edge_agent.algorithms.fedproto import FedProtoClient
from edge_agent.data.datasets import Dataset, load_digits
from edge_agent.models import build_model
from edge_agent.privacy.dp_training import RoundShape, train_private
from edge_agent.state import AgentStateDir
from protocol.messages import LocalTraining

CPU = torch.device("cpu")
_REAL_CHECK = dpt._check_per_sample


def _record0_grad_sample(tmp_path: Path, batch: list[int],
                         monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    pool, _ = load_digits()
    i0 = int(np.flatnonzero(pool.y == 0)[0])
    i1 = int(np.flatnonzero(pool.y == 1)[0])
    data = pool.subset(np.array([i0, i1]), "two")          # record 0: class 0, record 1: class 1
    model = build_model("mlp_tiny", (1, 8, 8), 10, seed=0)
    client = FedProtoClient({"lambda": 1.0}, AgentStateDir(tmp_path), RoundContext("run1", 2, "mlp_tiny", CPU))
    client.load(model, None)
    client.begin(model, None)
    # Global prototypes known for class 0 only (class 1 has no global support yet), far from the embeddings.
    client.global_prototypes = torch.full((10, model.embedding_dim), 3.0)
    client.known = torch.zeros(10, dtype=torch.bool)
    client.known[0] = True

    class FixedSampler:  # Poisson sampling could draw exactly these batches
        def __init__(self, **kw: object) -> None:
            pass

        def __iter__(self) -> Iterator[list[int]]:
            yield list(batch)

    monkeypatch.setattr(dpt, "UniformWithReplacementSampler", FixedSampler)
    captured: dict[str, torch.Tensor] = {}
    real_check = _REAL_CHECK
    def spy(model: torch.nn.Module, algorithm: object) -> None:
        for name, p in model.named_parameters():
            captured[name] = p.grad_sample[0].detach().clone()   # record 0 is first in both batches
        real_check(model, algorithm)
    monkeypatch.setattr(dpt, "_check_per_sample", spy)
    shape = RoundShape(0.5, 1)
    train_private(model, data, LocalTraining(epochs=1, learning_rate=0.01), shape, shape.charge(1.0), 1e6, CPU,
                  client)
    return captured


def test_a_records_per_sample_gradient_does_not_depend_on_the_rest_of_the_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _record0_grad_sample(tmp_path / "a", [0], monkeypatch)
    with_other = _record0_grad_sample(tmp_path / "b", [0, 1], monkeypatch)
    diff = sum((alone[k] - with_other[k]).pow(2).sum() for k in alone).sqrt().item()
    norm = sum(alone[k].pow(2).sum() for k in alone).sqrt().item()
    # With the aligned records' mean, record 0's alignment gradient doubled here (n / A from 1/1 to 2/1).
    assert diff <= 1e-5 * norm, f"record 0's per-sample gradient moved by {diff:.4g} (norm {norm:.4g})"


def test_one_overflowing_record_adds_nothing_rather_than_making_the_step_nan() -> None:
    """Opacus clips a record by C / its norm: an infinite norm gives 0, and 0 x inf is NaN in the noised sum. Whether
    the round survived would then hang on whether that one record was sampled."""
    pool, _ = load_digits()
    sub = pool.subset(np.arange(40), "digits-40")
    x = sub.x.copy()
    x[0] = 3e38  # a finite float32 input whose activations and gradient overflow
    data = Dataset(x, sub.y.copy(), sub.num_classes, "outlier")
    model = build_model("mlp_tiny", (1, 8, 8), 10, seed=0)
    shape = RoundShape(1.0, 1)  # every record in the batch
    train_private(model, data, LocalTraining(epochs=1, learning_rate=0.1), shape, shape.charge(1.0), 1.0, CPU,
                  FedAvgClient({}, None, RoundContext("run1", 1, "mlp_tiny", CPU)))  # type: ignore[arg-type]
    assert all(torch.isfinite(p).all() for p in model.parameters()), "one record made the privatised step NaN"
