"""weighted_mean against a brute-force reference, and FedAvg's rounds built on it."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coordinator.aggregation import AggregationError, weighted_mean
from coordinator.strategies.fedavg import FedAvg
from protocol.messages import GlobalState, TrainMetrics, Update
from tests.task_refs import DIGITS

FAST = settings(deadline=None, max_examples=50)

values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def brute_force_mean(updates: list[dict[str, np.ndarray]], weights: list[float], name: str) -> np.ndarray:
    """sum_i w_i x_i / sum_i w_i, element by element with exact float sums (math.fsum)."""
    shape = updates[0][name].shape
    total = math.fsum(weights)
    out = np.empty(shape, dtype=np.float64)
    for index in np.ndindex(*shape):
        out[index] = math.fsum(w * float(u[name][index]) for u, w in zip(updates, weights, strict=True)) / total
    return out


@st.composite
def client_arrays(draw: st.DrawFn) -> tuple[list[dict[str, np.ndarray]], list[float]]:
    n = draw(st.integers(1, 6))
    layout = draw(st.dictionaries(st.text(min_size=1, max_size=6), hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                                  min_size=1, max_size=3))
    updates = [{name: draw(hnp.arrays(np.float64, shape, elements=values)) for name, shape in layout.items()}
               for _ in range(n)]
    # Sample counts, or fractional weights (zero, or far enough from zero that w * x cannot underflow)
    weights = draw(st.lists(st.integers(0, 10_000).map(float) | st.just(0.0) | st.floats(1e-3, 1e4),
                            min_size=n, max_size=n))
    assume(sum(weights) > 0)
    return updates, weights


@FAST
@given(client_arrays())
def test_weighted_mean_matches_brute_force(case: tuple[list[dict[str, np.ndarray]], list[float]]) -> None:
    updates, weights = case
    merged = weighted_mean(updates, weights)
    assert list(merged) == list(updates[0])
    for name in updates[0]:
        expected = brute_force_mean(updates, weights, name)
        assert merged[name].dtype == np.float64
        assert merged[name].shape == expected.shape
        scale = max(1.0, max(float(np.abs(u[name]).max(initial=0.0)) for u in updates))
        np.testing.assert_allclose(merged[name], expected, rtol=1e-12, atol=1e-12 * scale)
        np.testing.assert_allclose(merged[name], np.average(np.stack([u[name] for u in updates]), axis=0,
                                                            weights=weights), rtol=1e-9, atol=1e-9 * scale)


@FAST
@given(client_arrays(), st.sampled_from([np.float16, np.float32]))
def test_narrow_floats_come_back_in_their_dtype_rounded_once(
    case: tuple[list[dict[str, np.ndarray]], list[float]], dtype: type[np.floating]
) -> None:
    updates, weights = case
    narrow = [{k: np.clip(v, -1000.0, 1000.0).astype(dtype) for k, v in u.items()} for u in updates]
    merged = weighted_mean(narrow, weights)
    for name in narrow[0]:
        assert merged[name].dtype == dtype
        exact = brute_force_mean(narrow, weights, name)
        # Rounded once from float64: within an ulp of the exact mean, plus the float64 noise of
        # accumulating large terms that cancel (the mean of 1000 and -1000 may come out 1e-13).
        ulp = np.spacing(np.abs(exact.astype(dtype))).astype(np.float64)
        scale = max(float(np.abs(u[name]).max(initial=0.0)) for u in narrow)
        float64_noise = 8 * np.finfo(np.float64).eps * scale  # cancellation of large terms
        error = np.abs(merged[name].astype(np.float64) - exact)
        assert (error <= ulp + float64_noise).all(), float((error - ulp).max())


def test_accumulates_in_float64() -> None:
    # One heavy client at 1.0 and a thousand light ones whose terms are each below half an
    # ulp of the running sum in float32: float32 accumulation loses them, float64 does not.
    n_light = 1000
    updates = [{"w": np.array([1.0, 1.0], dtype=np.float32)}]
    updates += [{"w": np.array([0.05, 0.05], dtype=np.float32)} for _ in range(n_light)]
    weights = [1.0] + [1e-6] * n_light
    expected = np.float32(brute_force_mean(updates, weights, "w")[0])

    total = np.float32(sum(weights))
    naive = np.zeros(2, dtype=np.float32)
    for update, weight in zip(updates, weights, strict=True):
        naive += update["w"] * np.float32(weight) / total
    assert abs(int(naive[0].view(np.int32)) - int(expected.view(np.int32))) > 10, "case must defeat float32"

    merged = weighted_mean(updates, weights)["w"]
    assert merged.dtype == np.float32
    np.testing.assert_array_max_ulp(merged, np.array([expected, expected]), maxulp=1)


@pytest.mark.parametrize("dtype", ["<i8", "<i4", "<u1", "|b1"])
def test_integer_buffers_are_taken_from_the_heaviest_update(dtype: str) -> None:
    updates = [
        {"w": np.array([0.0]), "count": np.array([1, 0, 1], dtype=dtype)},
        {"w": np.array([1.0]), "count": np.array([0, 1, 1], dtype=dtype)},
        {"w": np.array([2.0]), "count": np.array([1, 1, 0], dtype=dtype)},
    ]
    merged = weighted_mean(updates, [1.0, 5.0, 2.0])
    assert merged["count"].dtype == np.dtype(dtype)
    assert np.array_equal(merged["count"], updates[1]["count"])
    assert merged["w"][0] == pytest.approx((0 * 1 + 1 * 5 + 2 * 2) / 8)


def test_integer_buffers_take_the_first_of_equal_weights() -> None:
    updates = [{"n": np.array(i, dtype=np.int64)} for i in (10, 20, 30, 40)]
    assert weighted_mean(updates, [1.0, 3.0, 3.0, 2.0])["n"] == 20
    assert weighted_mean(updates, [0.0, 0.0, 0.0, 7.0])["n"] == 40


def test_integer_buffers_are_copies() -> None:
    updates = [{"n": np.array([5, 6], dtype=np.int64)}]
    merged = weighted_mean(updates, [1.0])
    merged["n"][0] = 0
    assert updates[0]["n"][0] == 5


def test_zero_weights_are_ignored() -> None:
    poisoned = {"w": np.array([np.nan, np.inf, -np.inf]), "n": np.array(99)}
    updates = [{"w": np.array([1.0, 2.0, 3.0]), "n": np.array(1)}, poisoned, {"w": np.array([3.0, 4.0, 5.0]),
                                                                            "n": np.array(2)}]
    merged = weighted_mean(updates, [1.0, 0.0, 3.0])
    np.testing.assert_allclose(merged["w"], [2.5, 3.5, 4.5])
    assert merged["n"] == 2


def test_a_single_update_is_returned_as_is() -> None:
    update = {"w": np.array([[1.5, -2.0]], dtype=np.float32), "n": np.array(3, dtype=np.int64)}
    merged = weighted_mean([update], [17.0])
    assert np.array_equal(merged["w"], update["w"]) and merged["w"].dtype == np.float32
    assert merged["n"] == 3


@pytest.mark.parametrize(
    "weights",
    [[], [1.0], [1.0, 2.0, 3.0], [1.0, -1.0], [0.0, 0.0], [1.0, float("nan")], [float("inf"), 1.0],
     [-0.0, 0.0]],
)
def test_bad_weights(weights: list[float]) -> None:
    updates = [{"w": np.zeros(2)}, {"w": np.ones(2)}]
    with pytest.raises(AggregationError) as info:
        weighted_mean(updates, weights)
    assert info.value.reason == "bad_weights"


def test_nothing_to_aggregate() -> None:
    with pytest.raises(AggregationError) as info:
        weighted_mean([], [])
    assert info.value.reason == "no_updates"


@pytest.mark.parametrize(
    "other",
    [
        {"w": np.zeros(3)},
        {"w": np.zeros((2, 1)), "b": np.zeros(1)},
        {"w": np.zeros(2), "c": np.zeros(1)},
        {"w": np.zeros(2)},
        {"w": np.zeros(2), "b": np.zeros(1), "extra": np.zeros(1)},
    ],
)
def test_layout_mismatch(other: dict[str, np.ndarray]) -> None:
    updates = [{"w": np.zeros(2), "b": np.zeros(1)}, other]
    with pytest.raises(AggregationError) as info:
        weighted_mean(updates, [1.0, 1.0])
    assert info.value.reason == "layout_mismatch"


def test_aggregation_error_is_a_value_error() -> None:
    assert issubclass(AggregationError, ValueError)


# ---------------------------------------------------------------------------- FedAvg


def make_update(agent: str, round_number: int, num_samples: int, *, weights: dict[str, np.ndarray] | None = None,
                delta: dict[str, np.ndarray] | None = None, base_digest: str | None = None,
                family: str = "cnn") -> Update:
    return Update(run_id="run", agent_id=agent, round=round_number, task="train", task_ref=DIGITS, family=family,
                  base_digest=base_digest, num_samples=num_samples, weights=weights or {}, delta=delta or {},
                  metrics=TrainMetrics())


def random_layout(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "conv.weight": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
        "conv.bias": rng.standard_normal(4).astype(np.float32),
        "fc.weight": rng.standard_normal((10, 4)).astype(np.float32),
        "steps": np.array(int(rng.integers(0, 100)), dtype=np.int64),
    }


def test_fedavg_bootstrap_and_delta_rounds_match_brute_force() -> None:
    rng = np.random.default_rng(7)
    strategy = FedAvg(weighted_mean, server_learning_rate=0.5)
    samples = [30, 10, 60]

    # Round 0: no global state yet; agents send the seeded initial weights, and the first state is the
    # proposal a strict majority sent alike, exactly (tests/unit/coordinator/test_bootstrap_majority.py).
    sent = random_layout(rng)
    strategy.aggregate(0, [make_update(f"a{i}", 0, n, weights=sent) for i, n in enumerate(samples)])
    state = strategy.states["cnn"]
    assert state.round == 1
    for name in ("conv.weight", "conv.bias", "fc.weight", "steps"):
        assert state.weights[name].tobytes() == sent[name].tobytes() and state.weights[name].dtype == sent[name].dtype
    assert state.digest == GlobalState.compute_digest(state.weights, {}, None, None)

    # Round 1: agents send deltas from that state; global + lr * weighted mean of deltas.
    start = {k: v.copy() for k, v in state.weights.items()}
    deltas = [random_layout(rng) for _ in samples]
    strategy.aggregate(1, [make_update(f"a{i}", 1, n, delta=d, base_digest=state.digest)
                           for i, (d, n) in enumerate(zip(deltas, samples, strict=True))])
    after = strategy.states["cnn"]
    assert after.round == 2
    assert after.digest != state.digest
    for name in ("conv.weight", "conv.bias", "fc.weight"):
        mean_delta = brute_force_mean(deltas, [float(n) for n in samples], name)
        expected = start[name].astype(np.float64) + 0.5 * mean_delta
        # The mean delta is stored in float32 before it is applied, and so is the sum:
        # two roundings, each within half an ulp of what it rounds.
        bound = np.finfo(np.float32).eps * (np.abs(start[name]) + 0.5 * np.abs(mean_delta))
        assert after.weights[name].dtype == np.float32
        assert (np.abs(after.weights[name] - expected) <= bound).all()
    # Integer buffers: the heaviest client's delta is applied as is (not scaled).
    assert after.weights["steps"] == start["steps"] + deltas[2]["steps"]


def test_fedavg_aggregates_each_family_on_its_own() -> None:
    strategy = FedAvg(weighted_mean)
    updates = [
        make_update("a", 0, 1, weights={"w": np.array([3.0, 5.0])}, family="small"),
        make_update("b", 0, 3, weights={"w": np.array([3.0, 5.0])}, family="small"),
        make_update("c", 0, 5, weights={"w": np.array([10.0]), "v": np.array([1.0])}, family="large"),
    ]
    strategy.aggregate(0, updates)
    np.testing.assert_allclose(strategy.states["small"].weights["w"], [3.0, 5.0])
    np.testing.assert_allclose(strategy.states["large"].weights["w"], [10.0])
    assert {s.round for s in strategy.states.values()} == {1}


def test_fedavg_server_learning_rate_one_is_plain_averaging() -> None:
    strategy = FedAvg(weighted_mean)
    strategy.aggregate(0, [make_update("a", 0, 1, weights={"w": np.array([1.0, 1.0])})])
    digest = strategy.states["cnn"].digest
    strategy.aggregate(1, [
        make_update("a", 1, 1, delta={"w": np.array([1.0, -1.0])}, base_digest=digest),
        make_update("b", 1, 3, delta={"w": np.array([-1.0, 3.0])}, base_digest=digest),
    ])
    np.testing.assert_allclose(strategy.states["cnn"].weights["w"], [1.0 - 0.5, 1.0 + 2.0])
