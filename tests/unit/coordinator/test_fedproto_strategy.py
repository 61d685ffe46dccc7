"""FedProto on the coordinator: per-class aggregation, momentum, normalisation, state."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.admission.decisions import Reject
from coordinator.aggregation import weighted_mean
from coordinator.strategies import FedProto
from coordinator.strategies.fedproto import aggregate_prototypes, report_drift
from protocol.messages import TrainMetrics, Update
from tests.task_refs import DIGITS

CLASSES, DIM = 5, 4


def proto_update(agent: str, prototypes: np.ndarray, counts: np.ndarray, family: str = "f",
                 base: str | None = None) -> Update:
    return Update(run_id="r", agent_id=agent, round=1, task="train", task_ref=DIGITS, family=family, base_digest=base,
                  num_samples=int(counts.sum()), prototypes=prototypes.astype(np.float32),
                  prototype_counts=counts.astype(np.int64), metrics=TrainMetrics())


def local_prototypes(embeddings: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(labels, minlength=CLASSES)
    protos = np.zeros((CLASSES, embeddings.shape[1]), dtype=np.float32)
    for c in np.flatnonzero(counts):
        protos[c] = embeddings[labels == c].mean(axis=0)
    return protos, counts


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), agents=st.integers(1, 6))
def test_aggregation_equals_the_brute_force_mean_of_each_class_over_every_sample(seed: int, agents: int) -> None:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(agents):
        n = int(rng.integers(1, 30))
        held = rng.choice(CLASSES, size=int(rng.integers(1, CLASSES + 1)), replace=False)  # some classes missing
        samples.append((rng.normal(size=(n, DIM)).astype(np.float32), rng.choice(held, size=n)))
    local = [local_prototypes(x, y) for x, y in samples]
    merged, counts = aggregate_prototypes(weighted_mean, [p for p, _ in local], [c for _, c in local])

    all_x = np.concatenate([x for x, _ in samples]).astype(np.float64)
    all_y = np.concatenate([y for _, y in samples])
    for c in range(CLASSES):
        members = all_x[all_y == c]
        assert counts[c] == len(members)
        if len(members):
            np.testing.assert_allclose(merged[c], members.mean(axis=0), rtol=1e-5, atol=1e-5)
        else:
            assert not merged[c].any()


def test_the_strategy_publishes_one_set_of_prototypes_for_every_known_family() -> None:
    strategy = FedProto(weighted_mean, 1.0)
    p = np.ones((CLASSES, DIM), np.float32)
    updates = [proto_update("a", p, np.array([1, 0, 0, 0, 0]), "cnn_large"),
               proto_update("b", 3 * p, np.array([3, 0, 2, 0, 0]), "mlp_tiny")]
    assert strategy.aggregate(1, updates, population={"cnn_large": 1, "mlp_tiny": 1, "cnn_small": 4}) == []
    assert sorted(strategy.states) == ["cnn_large", "cnn_small", "mlp_tiny"]
    digests = {s.digest for s in strategy.states.values()}
    assert len(digests) == 1 and all(not s.weights and s.round == 2 for s in strategy.states.values())
    state = strategy.states["cnn_small"]
    np.testing.assert_allclose(state.prototypes[0], 2.5)  # (1 * 1 + 3 * 3) / 4
    np.testing.assert_allclose(state.prototypes[2], 3.0)
    assert state.prototype_counts.tolist() == [4, 0, 2, 0, 0]
    assert state.message("r", "cnn_small").digest == state.digest  # the wire model accepts it


def test_momentum_mixes_where_both_exist_and_classes_not_reported_keep_their_prototype() -> None:
    strategy = FedProto(weighted_mean, 1.0, momentum=0.75)
    ones = np.ones((CLASSES, DIM), np.float32)
    strategy.aggregate(1, [proto_update("a", ones, np.array([1, 1, 0, 0, 0]))])
    digest = strategy.states["f"].digest
    strategy.aggregate(2, [proto_update("a", 5 * ones, np.array([0, 2, 3, 0, 0]), base=digest)])
    protos, counts = strategy.prototypes, strategy.counts
    assert protos is not None and counts is not None
    np.testing.assert_allclose(protos[0], 1.0)  # not reported: kept
    np.testing.assert_allclose(protos[1], 0.75 * 1 + 0.25 * 5)  # both: mixed
    np.testing.assert_allclose(protos[2], 5.0)  # new: taken as is
    assert not protos[3].any() and counts.tolist() == [1, 2, 3, 0, 0]


def test_normalised_prototypes_have_unit_length() -> None:
    strategy = FedProto(weighted_mean, 1.0, momentum=0.5, normalize=True)
    rng = np.random.default_rng(0)
    for round_number in (1, 2):
        base = strategy.states["f"].digest if strategy.states else None
        strategy.aggregate(round_number, [proto_update(a, rng.normal(size=(CLASSES, DIM)), np.array([2, 1, 0, 4, 1]),
                                                       base=base) for a in "abc"])
        assert strategy.prototypes is not None
        np.testing.assert_allclose(np.linalg.norm(strategy.prototypes[[0, 1, 3, 4]], axis=1), 1.0, rtol=1e-5)
        assert not strategy.prototypes[2].any()


def test_lambda_warms_up_linearly_and_is_announced() -> None:
    strategy = FedProto(weighted_mean, 2.0, warmup_rounds=4, normalize=True)
    assert [strategy.round_params(r)["lambda"] for r in (1, 2, 3, 5, 9)] == [0.0, 0.5, 1.0, 2.0, 2.0]
    assert strategy.round_params(1)["normalize"] is True
    assert FedProto(weighted_mean, 2.0).round_params(1)["lambda"] == 2.0


def test_updates_are_checked_against_the_global_prototypes() -> None:
    strategy = FedProto(weighted_mean, 1.0)
    ones = np.ones((CLASSES, DIM), np.float32)
    assert_rejected("float32", strategy.check_update(proto_update("a", ones, np.ones(CLASSES)).model_copy(
            update={"prototypes": ones.astype(np.float64)})))
    strategy.aggregate(1, [proto_update("a", ones, np.ones(CLASSES))])
    digest = strategy.states["f"].digest
    assert strategy.check_update(proto_update("a", ones, np.ones(CLASSES), base=digest)) is None
    assert_rejected("stale_base", strategy.check_update(proto_update("a", ones, np.ones(CLASSES), base="0" * 32)))
    assert_rejected("expected", strategy.check_update(proto_update("a", np.ones((CLASSES, DIM + 1)), np.ones(CLASSES), base=digest)))
    missing = Update(run_id="r", agent_id="a", round=2, task="train", task_ref=DIGITS, family="f", base_digest=digest, num_samples=1,
                     metrics=TrainMetrics())
    assert_rejected("missing_payload", strategy.check_update(missing))


def test_a_bootstrap_shape_outvoted_by_the_majority_is_dropped() -> None:
    strategy = FedProto(weighted_mean, 1.0)
    good = [proto_update(a, np.ones((CLASSES, DIM)), np.ones(CLASSES)) for a in "ab"]
    odd = proto_update("c", np.ones((CLASSES, DIM + 3)), np.full(CLASSES, 100))
    dropped = strategy.aggregate(1, [odd, *good])
    assert [d.agent_id for d in dropped] == ["c"]
    assert strategy.prototypes is not None and strategy.prototypes.shape == (CLASSES, DIM)


def test_state_round_trips_and_bad_state_is_refused() -> None:
    strategy = FedProto(weighted_mean, 1.0, momentum=0.5)
    strategy.aggregate(1, [proto_update("a", np.ones((CLASSES, DIM)), np.ones(CLASSES))], population={"g": 2})
    restored = FedProto(weighted_mean, 1.0, momentum=0.5)
    restored.load_state_dict(strategy.state_dict())
    assert {f: s.digest for f, s in restored.states.items()} == {f: s.digest for f, s in strategy.states.items()}
    np.testing.assert_array_equal(restored.prototypes, strategy.prototypes)
    broken = strategy.state_dict() | {"prototypes": np.ones((CLASSES, DIM, 1), np.float32)}
    with pytest.raises(ValueError, match="fedproto checkpoint"):
        FedProto(weighted_mean, 1.0).load_state_dict(broken)


def test_an_agent_far_from_the_global_prototypes_is_flagged(caplog: pytest.LogCaptureFixture) -> None:
    ones = np.ones((CLASSES, DIM), np.float32)
    updates = [proto_update(a, ones, np.ones(CLASSES)).model_copy(
        update={"metrics": TrainMetrics(extra={"proto_distance": d})}) for a, d in zip("abcd", (0.4, 0.5, 0.6, 2.5), strict=True)]
    with caplog.at_level("INFO", logger="coordinator.strategies.fedproto"):
        assert report_drift(3, updates) == ["d"]
    assert "median 0.550, max 2.500 (d)" in caplog.text and "prototypes of d lie over 3x" in caplog.text
    assert report_drift(3, updates[:3]) == []


def assert_rejected(pattern: str, problem: Reject | None) -> None:
    """The check refused, and its reason and detail match ``pattern``."""
    import re

    assert problem is not None and re.search(pattern, f"{problem.reason.value}: {problem.detail}"), problem
