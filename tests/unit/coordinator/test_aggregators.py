"""Preconditions of the robust rules, their configuration, and FedAvg running on each of them."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from coordinator.aggregation import (
    AggregationError,
    FailureReason,
    coordinate_median,
    krum,
    multi_krum,
    trimmed_mean,
    weighted_mean,
)
from coordinator.aggregation.aggregator import Aggregator, build_aggregator
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.fedavg import FedAvg
from protocol.messages import TrainMetrics, Update
from service_kit.settings import ConfigError, load_settings
from tests.task_refs import DIGITS


def ones(n: int, size: int = 3) -> list[dict[str, np.ndarray]]:
    return [{"w": np.full(size, float(i))} for i in range(n)]


def reason_of(call: Callable[[], object]) -> str:
    with pytest.raises(AggregationError) as info:
        call()
    return info.value.reason


# -- preconditions -------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "f"), [(4, 1), (2, 0), (6, 2), (1, 0), (8, 3)])
def test_krum_needs_more_than_2f_plus_2_updates(n: int, f: int) -> None:
    updates = ones(n)
    assert reason_of(lambda: krum(updates, [1.0] * n, f=f)) == "too_few_updates"
    assert reason_of(lambda: multi_krum(updates, [1.0] * n, f=f)) == "too_few_updates"
    krum(ones(2 * f + 3), [1.0] * (2 * f + 3), f=f)  # one more is enough


def test_updates_of_weight_zero_do_not_count_towards_n() -> None:
    updates = ones(5)
    krum(updates, [1.0] * 5, f=1)
    with pytest.raises(AggregationError, match=r"n > 2f \+ 2 = 4, got n=4"):
        krum(updates, [1.0, 1.0, 0.0, 1.0, 1.0], f=1)


def test_multi_krum_m_must_lie_between_1_and_n_minus_f() -> None:
    updates = ones(7)
    multi_krum(updates, [1.0] * 7, f=2, m=5)
    assert reason_of(lambda: multi_krum(updates, [1.0] * 7, f=2, m=6)) == "too_few_updates"
    assert reason_of(lambda: multi_krum(updates, [1.0] * 7, f=2, m=0)) == "invalid_parameter"


@pytest.mark.parametrize(("n", "f"), [(2, 1), (4, 2), (1, 1)])
def test_median_needs_a_strict_honest_majority(n: int, f: int) -> None:
    assert reason_of(lambda: coordinate_median(ones(n), [1.0] * n, f=f)) == "too_few_updates"
    coordinate_median(ones(2 * f + 1), [1.0] * (2 * f + 1), f=f)


@pytest.mark.parametrize("beta", [0.5, 0.7, -0.1, float("nan")])
def test_trimmed_mean_needs_beta_below_one_half(beta: float) -> None:
    assert reason_of(lambda: trimmed_mean(ones(5), [1.0] * 5, beta=beta)) == "invalid_parameter"


def test_trimmed_mean_must_trim_at_least_f_per_end() -> None:
    # beta 0.2 of 9 updates trims 1 per end: not enough for f = 2, and it says so instead of averaging.
    with pytest.raises(AggregationError, match="cannot exclude f=2") as info:
        trimmed_mean(ones(9), [1.0] * 9, beta=0.2, f=2)
    assert info.value.reason == "too_few_updates"
    trimmed_mean(ones(10), [1.0] * 10, beta=0.2, f=2)


@pytest.mark.parametrize("rule", [
    lambda u, w: krum(u, w, f=-1), lambda u, w: coordinate_median(u, w, f=-1),
    lambda u, w: trimmed_mean(u, w, beta=0.1, f=-1), lambda u, w: weighted_mean(u, w, clip_norm=0.0),
    lambda u, w: coordinate_median(u, w, clip_norm=float("nan")), lambda u, w: krum(u, w, f=0, clip_norm=-1.0),
])
def test_invalid_parameters(rule: Callable[..., object]) -> None:
    assert reason_of(lambda: rule(ones(5), [1.0] * 5)) == "invalid_parameter"


@pytest.mark.parametrize("rule", [coordinate_median, lambda u, w: krum(u, w, f=0),
                                  lambda u, w: trimmed_mean(u, w, beta=0.1)])
def test_shared_input_checks(rule: Callable[..., object]) -> None:
    assert reason_of(lambda: rule([], [])) == "no_updates"
    assert reason_of(lambda: rule(ones(3), [1.0, 1.0])) == "bad_weights"
    assert reason_of(lambda: rule(ones(3), [0.0, 0.0, 0.0])) == "bad_weights"
    mixed = ones(3)
    mixed[1] = {"w": np.zeros(3, dtype=np.float32)}
    assert reason_of(lambda: rule(mixed, [1.0] * 3)) == "layout_mismatch"
    complex_ = [{"w": np.zeros(3, dtype=np.complex128)} for _ in range(3)]
    assert reason_of(lambda: rule(complex_, [1.0] * 3)) == "unsupported_dtype"


def test_every_reason_is_a_known_label() -> None:
    with pytest.raises(ValueError):
        AggregationError("made_up", "x")
    assert AggregationError(FailureReason.TOO_FEW_UPDATES, "x").reason == "too_few_updates"


# -- memory ----------------------------------------------------------------------------------------


def peak_bytes(call: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("rule", [
    weighted_mean, coordinate_median, lambda u, w: trimmed_mean(u, w, beta=0.2),
    lambda u, w: krum(u, w, f=1), lambda u, w: multi_krum(u, w, f=1),
])
def test_working_memory_does_not_grow_with_the_number_of_updates(rule: Callable[..., object]) -> None:
    rng = np.random.default_rng(0)
    size = 1_000_000
    few = [{"w": rng.standard_normal(size, dtype=np.float32)} for _ in range(5)]
    many = few * 8  # 40 updates (the same arrays: only the aggregation's own memory is traced)
    output = size * 4
    small, large = peak_bytes(lambda: rule(few, [1.0] * 5)), peak_bytes(lambda: rule(many, [1.0] * 40))
    # The output, one block buffer (8 MiB budget) and small change; n x d float64 would be 320 MB.
    assert large <= output + 10 * 2**20, large
    assert large <= small + 2**20, (small, large)


# -- configuration ---------------------------------------------------------------------------------


def test_settings_name_the_bad_field() -> None:
    for field, value in (("trim_beta", 0.5), ("byzantine_f", -1), ("multi_krum_m", 0), ("clip_norm", 0.0),
                         ("aggregator", "geomed")):
        with pytest.raises(ConfigError, match=field):
            load_settings(CoordinatorSettings, overrides={field: value})


@pytest.mark.parametrize(("name", "expected"), [
    ("mean", "mean()"), ("median", "median(f=2)"), ("trimmed_mean", "trimmed_mean(beta=0.25, f=2)"),
    ("krum", "krum(f=2)"), ("multi_krum", "multi_krum(f=2, m=3, clip_norm=1.5)"),
])
def test_build_aggregator_binds_the_configured_parameters(name: str, expected: str) -> None:
    settings = CoordinatorSettings(aggregator=name, byzantine_f=2, trim_beta=0.25, multi_krum_m=3,
                                   clip_norm=1.5 if name == "multi_krum" else None)
    aggregator = build_aggregator(settings)
    assert aggregator.describe() == expected
    rng = np.random.default_rng(1)
    updates = [{"w": rng.standard_normal(4)} for _ in range(9)]
    direct = {"mean": lambda: weighted_mean(updates, [1.0] * 9),
              "median": lambda: coordinate_median(updates, [1.0] * 9, f=2),
              "trimmed_mean": lambda: trimmed_mean(updates, [1.0] * 9, beta=0.25, f=2),
              "krum": lambda: krum(updates, [1.0] * 9, f=2),
              "multi_krum": lambda: multi_krum(updates, [1.0] * 9, f=2, m=3, clip_norm=1.5)}[name]()
    np.testing.assert_array_equal(aggregator(updates, [1.0] * 9)["w"], direct["w"])


# -- FedAvg on every aggregator ------------------------------------------------------------------


def make_update(agent: str, round_number: int, samples: int, **payload: object) -> Update:
    return Update(run_id="run", agent_id=agent, round=round_number, task="train", task_ref=DIGITS, family=str(payload.pop("family", "cnn")),
                  base_digest=payload.pop("base", None), num_samples=samples, metrics=TrainMetrics(),  # type: ignore[arg-type]
                  **payload)  # type: ignore[arg-type]


AGGREGATORS = {
    "mean": Aggregator("mean", weighted_mean),
    "median": Aggregator("median", coordinate_median, {"f": 1}),
    "trimmed_mean": Aggregator("trimmed_mean", trimmed_mean, {"beta": 0.2, "f": 1}),
    "krum": Aggregator("krum", krum, {"f": 1}),
    "multi_krum": Aggregator("multi_krum", multi_krum, {"f": 1}),
}


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_fedavg_bootstraps_and_steps_with_any_aggregator(name: str) -> None:
    aggregator = AGGREGATORS[name]
    rng = np.random.default_rng(3)
    strategy = FedAvg(aggregator, server_learning_rate=0.5)
    initial = {"w": rng.standard_normal((2, 3)).astype(np.float32)}
    samples = [10, 20, 30, 40, 50]
    strategy.aggregate(0, [make_update(f"a{i}", 0, s, weights=initial) for i, s in enumerate(samples)])
    start = strategy.states["cnn"]
    # Whatever the rule, the first state is the proposal a strict majority sent alike, exactly.
    np.testing.assert_array_equal(start.weights["w"], initial["w"])

    deltas = [{"w": rng.standard_normal((2, 3)).astype(np.float32)} for _ in range(5)]
    strategy.aggregate(1, [make_update(f"a{i}", 1, s, delta=d, base=start.digest)
                           for i, (d, s) in enumerate(zip(deltas, samples, strict=True))])
    step = aggregator(deltas, [float(s) for s in samples])["w"].astype(np.float64)
    expected = (start.weights["w"].astype(np.float64) + 0.5 * step).astype(np.float32)
    np.testing.assert_array_equal(strategy.states["cnn"].weights["w"], expected)
    assert strategy.states["cnn"].round == 2


def test_clipping_applies_to_deltas_not_to_bootstrap_weights() -> None:
    strategy = FedAvg(Aggregator("mean", weighted_mean, clip_norm=1.0))
    big = {"w": np.array([30.0, 40.0])}  # norm 50
    strategy.aggregate(0, [make_update("a", 0, 1, weights=big)])
    np.testing.assert_array_equal(strategy.states["cnn"].weights["w"], [30.0, 40.0])
    strategy.aggregate(1, [make_update("a", 1, 1, delta={"w": np.array([3.0, 4.0])},
                                       base=strategy.states["cnn"].digest)])
    np.testing.assert_allclose(strategy.states["cnn"].weights["w"], [30.6, 40.8])


def test_a_failing_family_leaves_every_family_unchanged() -> None:
    strategy = FedAvg(AGGREGATORS["krum"])  # f = 1: needs 5 updates per family
    strategy.aggregate(0, [make_update(f"{family}{i}", 0, 1, weights={"w": np.ones(2)}, family=family)
                           for family in ("big", "small") for i in range(5)])  # bootstraps combine by no rule
    before = dict(strategy.states)
    many = [make_update(f"a{i}", 1, 1, delta={"w": np.full(2, float(i))}, family="big", base=before["big"].digest)
            for i in range(5)]
    few = [make_update(f"b{i}", 1, 1, delta={"w": np.ones(2)}, family="small", base=before["small"].digest)
           for i in range(4)]
    with pytest.raises(AggregationError, match="got n=4"):
        strategy.aggregate(1, many + few)
    assert strategy.states == before
    strategy.aggregate(1, many)
    assert strategy.states["big"].round == 2 and strategy.states["small"] is before["small"]


def test_plain_functions_still_make_a_strategy() -> None:
    strategy = FedAvg(weighted_mean)
    assert isinstance(strategy.aggregator, Aggregator) and strategy.aggregator.describe() == "weighted_mean()"
