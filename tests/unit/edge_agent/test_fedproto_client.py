"""FedProto on the agent: personal model, prototypes out, classes it lacks, what it reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.algorithms.fedproto import personal_model_name
from edge_agent.models import EMBED_DIM, build_model
from edge_agent.prototypes import class_prototypes, embed_all
from edge_agent.state import AgentStateDir
from edge_agent.weights import set_arrays
from protocol.errors import ProtocolError
from tests.unit.edge_agent.rounds import RUN, announce, digits_subset, global_state, make_worker

MINE = [1, 4, 7]


def global_prototypes(seed: int = 0, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    counts = np.array([5] * 8 + [0] * (classes - 8), dtype=np.int64)  # classes 8 and 9: nobody has them yet
    protos = (rng.random((classes, EMBED_DIM)) * (counts > 0)[:, None]).astype(np.float32)
    return protos, counts


@pytest.mark.parametrize("family", ["cnn_large", "cnn_small", "mlp_tiny"])
@pytest.mark.parametrize("normalize", [False, True])
def test_an_agent_with_three_classes_trains_and_sends_only_prototypes(tmp_path: Path, family: str,
                                                                       normalize: bool) -> None:
    data = digits_subset(MINE, per_class=10)
    protos, counts = global_prototypes()
    state = global_state(family, 3, prototypes=protos, counts=counts)
    update = make_worker(tmp_path, data, family).answer(
        announce("fedproto", 3, state, params={"lambda": 1.0, "normalize": normalize}), state)
    assert not update.weights and not update.delta and not update.control_delta
    assert update.prototypes is not None and update.prototype_counts is not None
    assert update.prototypes.shape == (10, EMBED_DIM) and update.prototypes.dtype == np.float32
    assert update.prototype_counts.tolist() == [10 if c in MINE else 0 for c in range(10)]
    assert not update.prototypes[[c for c in range(10) if c not in MINE]].any()  # lacking classes: zero rows
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(update.prototypes[MINE], axis=1), 1.0, rtol=1e-5)
    extra = update.metrics.extra
    assert {"head_accuracy", "proto_accuracy", "proto_distance"} <= extra.keys()
    assert 0.0 <= extra["proto_accuracy"] <= 1.0 and extra["proto_distance"] > 0.0


def test_the_prototypes_are_the_class_means_of_the_trained_personal_model(tmp_path: Path) -> None:
    data = digits_subset(MINE, per_class=10)
    update = make_worker(tmp_path, data).answer(announce("fedproto", 1, params={"lambda": 1.0}), None)
    model = build_model("cnn_small", data.train.in_shape, 10, seed=0)
    saved = AgentStateDir(tmp_path).read_arrays(personal_model_name(RUN, "cnn_small"))
    assert saved is not None
    set_arrays(model, saved)
    embeddings, _ = embed_all(model, data.train, torch.device("cpu"), normalize=False)
    for c in MINE:
        np.testing.assert_allclose(update.prototypes[c], embeddings[torch.from_numpy(data.train.y == c)].mean(0),  # type: ignore[index]
                                   rtol=1e-5, atol=1e-6)


def test_the_personal_model_persists_across_rounds_and_restarts_and_resets_with_a_new_run(tmp_path: Path) -> None:
    data = digits_subset(MINE, per_class=10)
    name = personal_model_name(RUN, "cnn_small")
    make_worker(tmp_path, data).answer(announce("fedproto", 1, params={"lambda": 1.0}), None)
    after_round_1 = AgentStateDir(tmp_path).read_arrays(name)
    assert after_round_1 is not None

    # A restarted agent (new worker) evaluates the model it trained, not a fresh initialisation.
    protos, counts = global_prototypes()
    state = global_state("cnn_small", 2, prototypes=protos, counts=counts)
    evaluation = make_worker(tmp_path, data).answer(
        announce("fedproto", 2, state, params={"lambda": 1.0}, task="evaluate"), state)
    model = build_model("cnn_small", data.train.in_shape, 10, seed=0)
    set_arrays(model, after_round_1)
    _, logits = embed_all(model, data.held_out, torch.device("cpu"), normalize=False)
    head = (logits.argmax(1).numpy() == data.held_out.y).mean()
    assert evaluation.metrics.extra["head_accuracy"] == pytest.approx(head)
    assert evaluation.metrics.eval_accuracy == pytest.approx(head)

    make_worker(tmp_path, data).answer(announce("fedproto", 1, params={"lambda": 1.0}, run_id="run-2"), None)
    assert AgentStateDir(tmp_path).names("fedproto-") == [personal_model_name("run-2", "cnn_small")]


def test_lambda_zero_ignores_the_global_prototypes(tmp_path: Path) -> None:
    data = digits_subset(MINE, per_class=10)
    far = global_state("cnn_small", 2, prototypes=np.full((10, EMBED_DIM), 50.0, np.float32),
                       counts=np.ones(10, np.int64))
    near = global_state("cnn_small", 2, prototypes=np.zeros((10, EMBED_DIM), np.float32),
                        counts=np.ones(10, np.int64))
    a = make_worker(tmp_path / "a", data).answer(announce("fedproto", 2, far, params={"lambda": 0.0}), far)
    b = make_worker(tmp_path / "b", data).answer(announce("fedproto", 2, near, params={"lambda": 0.0}), near)
    np.testing.assert_array_equal(a.prototypes, b.prototypes)
    c = make_worker(tmp_path / "c", data).answer(announce("fedproto", 2, far, params={"lambda": 1.0}), far)
    assert not np.array_equal(a.prototypes, c.prototypes)


def test_global_prototypes_of_another_size_are_refused(tmp_path: Path) -> None:
    state = global_state("cnn_small", 2, prototypes=np.zeros((10, 32), np.float32), counts=np.ones(10, np.int64))
    with pytest.raises(ProtocolError, match="this model needs"):
        make_worker(tmp_path, digits_subset(MINE, per_class=2)).answer(
            announce("fedproto", 2, state, params={"lambda": 1.0}), state)


def test_class_prototypes_skip_missing_classes() -> None:
    embeddings = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    protos, counts = class_prototypes(embeddings, np.array([0, 0, 2]), 4, normalize=False)
    np.testing.assert_array_equal(protos, [[2.0, 0.0], [0.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(counts, [2, 0, 1, 0])
