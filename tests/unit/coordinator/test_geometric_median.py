"""The geometric median (RFA's smoothed Weiszfeld) against a plain numpy reference, streaming over
row blocks and spilled row matrices, clipping, and its place in the registry and the settings."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.aggregation import AggregationError, UpdateStack, weighted_mean
from coordinator.aggregation.aggregator import Aggregator, build_aggregator
from coordinator.aggregation.geometric_median import (
    DEFAULT_ITERATIONS,
    DEFAULT_SMOOTHING,
    DEFAULT_TOLERANCE,
    geometric_median,
    smoothed_weiszfeld,
)
from coordinator.aggregation.registry import RULES, needs_individual_updates
from coordinator.aggregation.rows import RowMatrix
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.fedavg import FedAvg
from service_kit.settings import ConfigError, load_settings
from tests.unit.coordinator import brute_force as bf
from tests.unit.coordinator.test_aggregators import make_update, peak_bytes
from tests.unit.coordinator.test_robust_aggregation import FAST, Case, assert_layout, cases, scale_of

Update = dict[str, np.ndarray]


def reference(updates: list[Update], iterations: int, smoothing: float, tolerance: float,
              clip_norm: float | None = None) -> tuple[np.ndarray, int]:
    """RFA's smoothed Weiszfeld written plainly: the updates (each counted once) as rows of one float64
    matrix, the distances recomputed from scratch each time. Returns z and the iterations run."""
    x = np.stack([np.asarray(bf.vector(u), dtype=np.float64) for u in updates]).reshape(len(updates), -1)
    if clip_norm is not None:
        norms = np.linalg.norm(x, axis=1)
        x = x * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))[:, None]
    z = x.mean(axis=0)
    objective = np.linalg.norm(x - z, axis=1).sum()
    for done in range(1, iterations + 1):
        betas = 1.0 / np.maximum(smoothing, np.linalg.norm(x - z, axis=1))
        z = betas @ x / betas.sum()
        previous, objective = objective, np.linalg.norm(x - z, axis=1).sum()
        if abs(previous - objective) <= tolerance * objective:
            return z, done
    return z, iterations


def flat_between(updates: list[Update], smoothing: float, k: int) -> bool:
    """Whether the sum of distances barely moves from iterate k - 1 to iterate k (k >= 1; iterate 0: the mean)."""
    x = np.stack([np.asarray(bf.vector(u), dtype=np.float64) for u in updates]).reshape(len(updates), -1)
    before, _ = reference(updates, k - 1, smoothing, -1.0) if k > 1 else (x.mean(axis=0), 0)
    after, _ = reference(updates, k, smoothing, -1.0)
    a, b = np.linalg.norm(x - before, axis=1).sum(), np.linalg.norm(x - after, axis=1).sum()
    return abs(a - b) <= 1e-12 * max(a, b, 1e-300)


def flat(merged: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in merged.values() if a.dtype.kind == "f"] or
                          [np.empty(0)])


def near(merged: dict[str, np.ndarray], expected: np.ndarray, scale: float) -> bool:
    """float64 outputs to 1e-9 of the inputs' scale; narrower ones to one ulp of the reference rounded, plus that."""
    actual = flat(merged)
    dtypes = [a.dtype for a in merged.values() if a.dtype.kind == "f"]
    allowed = 1e-9 * scale + (np.spacing(np.abs(expected).astype(dtypes[0])).astype(np.float64)
                              if dtypes and dtypes[0] != np.float64 else 0.0)
    return bool((np.abs(actual - expected) <= allowed).all())


def assert_near(merged: dict[str, np.ndarray], expected: np.ndarray, scale: float) -> None:
    assert near(merged, expected, scale), (flat(merged), expected)


def random_updates(rng: np.random.Generator, n: int, dtype: type = np.float32) -> list[Update]:
    return [{"w": rng.normal(size=(40, 30)).astype(dtype), "b": rng.normal(size=7).astype(dtype),
             "n": np.array(i % 4, np.int64)} for i in range(n)]


# -- against the reference -----------------------------------------------------------------------


@FAST
@given(cases(), st.integers(1, 6), st.sampled_from([1e-6, 1e-3, 0.5]))
def test_matches_plain_weiszfeld_on_the_concatenated_updates(case: Case, iterations: int, smoothing: float) -> None:
    # tolerance 0: both run every iteration, so a stop decided on the last bit cannot tell them apart
    merged = geometric_median(case.updates, case.weights, iterations=iterations, smoothing=smoothing, tolerance=0.0)
    assert_layout(merged, case)
    expected, done = reference(case.active, iterations, smoothing, 0.0)
    if not near(merged, expected, scale_of(case)):
        # A flat objective (ties: z inside a median interval) is where the stop is decided on the last bit of
        # two differently summed distances: then, and only then, one iteration more or less is the same answer.
        for other in (done - 1, done + 1):
            if 1 <= other <= iterations and flat_between(case.active, smoothing, min(done, other)):
                candidate, _ = reference(case.active, other, smoothing, -1.0)
                if near(merged, candidate, scale_of(case)):
                    expected = candidate
    assert_near(merged, expected, scale_of(case))
    for name in (k for k, a in case.updates[0].items() if a.dtype.kind != "f"):
        np.testing.assert_array_equal(merged[name], bf.lower_median_int(case.active, name))


@pytest.mark.parametrize("seed", range(3))
def test_stops_where_the_reference_stops(seed: int) -> None:
    rng = np.random.default_rng(seed)
    updates = random_updates(rng, 9, np.float64)
    for update in updates[:3]:  # outliers: the mean starts far from the median, so it takes a few steps
        update["w"] = 30.0 * update["w"] + 5.0
    stack = UpdateStack(updates, [1.0] * 9)
    counts = []
    for tolerance in (1e-4, 1e-7):
        merged, done = smoothed_weiszfeld(stack, 50, 1e-6, tolerance)
        expected, expected_done = reference(updates, 50, 1e-6, tolerance)
        assert done == expected_done
        np.testing.assert_allclose(flat(merged), expected, rtol=1e-12, atol=1e-12)
        counts.append(done)
    assert 1 < counts[0] < counts[1] < 50
    assert smoothed_weiszfeld(stack, 2, 1e-6, 1e-7)[1] == 2  # the iteration cap


def test_stays_with_the_honest_cluster_where_the_mean_is_dragged_away() -> None:
    rng = np.random.default_rng(7)
    centre = rng.normal(size=500)
    honest = [{"w": centre + 0.1 * rng.normal(size=500)} for _ in range(7)]
    attackers = [{"w": -20.0 * centre + rng.normal(size=500)} for _ in range(3)]  # sign flip, scaled
    updates = honest + attackers
    weights = [10.0] * 7 + [1e6] * 3  # claimed sample counts do not matter
    honest_mean = np.mean([u["w"] for u in honest], axis=0)
    spread = max(np.linalg.norm(u["w"] - honest_mean) for u in honest)
    median = geometric_median(updates, weights, f=3)["w"]
    mean = weighted_mean(updates, [1.0] * 10)["w"]
    assert np.linalg.norm(median - honest_mean) < spread
    assert np.linalg.norm(mean - honest_mean) > 10 * spread
    np.testing.assert_allclose(median, reference(updates, 10, 1e-6, 1e-6)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_identical_updates_give_that_update(dtype: type) -> None:
    point = {"w": np.random.default_rng(2).normal(size=(5, 3)).astype(dtype), "c": np.array([4, 1], np.int64)}
    merged = geometric_median([dict(point) for _ in range(6)], [3.0, 1.0, 1.0, 2.0, 1.0, 5.0], f=2)
    assert merged["w"].dtype == dtype and merged["c"].tolist() == [4, 1]
    if dtype == np.float32:  # float64 error far below float32's ulp
        np.testing.assert_array_equal(merged["w"], point["w"])
    else:
        np.testing.assert_allclose(merged["w"], point["w"], rtol=4 * np.finfo(np.float64).eps)


def test_one_update_is_its_own_median() -> None:
    update = {"w": np.array([1.0, -2.0, 3.0], np.float32)}
    np.testing.assert_array_equal(geometric_median([update, update], [0.0, 1.0])["w"], update["w"])


# -- streaming -------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [None, 20.0])
def test_small_row_blocks_give_the_in_memory_result(clip: float | None) -> None:
    rng = np.random.default_rng(3)
    updates = random_updates(rng, 9)
    one_block = UpdateStack(updates, [1.0] * 9, clip_norm=clip)
    blocks = UpdateStack(updates, [1.0] * 9, clip_norm=clip, block_bytes=4096)  # 256 columns: 5 blocks
    assert len(list(blocks.blocks(blocks.block_width()))) == 5 and len(list(one_block.blocks())) == 1
    (whole, done), (streamed, streamed_done) = (smoothed_weiszfeld(s, 8, 1e-6, 0.0) for s in (one_block, blocks))
    assert done == streamed_done == 8
    for name in whole:  # only the order of float64 additions differs
        np.testing.assert_allclose(streamed[name], whole[name], rtol=1e-6, atol=1e-7)
        assert np.abs(streamed[name].astype(np.float64) - whole[name]).max() <= 2 * np.spacing(np.float32(10))


@pytest.mark.parametrize("budget", [1 << 30, 0], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("clip", [None, 20.0])
def test_row_matrices_give_exactly_the_result_of_separate_updates(tmp_path: Path, budget: int,
                                                                  clip: float | None) -> None:
    rng = np.random.default_rng(4)
    updates = random_updates(rng, 9)
    weights = [float(w) for w in rng.integers(1, 50, size=9)]
    matrix = RowMatrix(updates[0], len(updates), budget_bytes=budget, spill_dir=tmp_path / "spill")
    rows = [matrix.append(u) for u in updates]
    assert matrix.spilled == (budget == 0)
    separate = geometric_median(updates, weights, f=2, clip_norm=clip)
    from_rows = geometric_median(rows, weights, f=2, clip_norm=clip)
    for name in separate:
        np.testing.assert_array_equal(from_rows[name], separate[name], err_msg=name)
    expected, _ = reference(updates, 10, 1e-6, 1e-6, clip)
    assert_near(separate, expected, 10.0)
    matrix.close()


def test_a_robust_round_keeps_the_updates_as_rows_and_a_mean_round_folds_them(tmp_path: Path) -> None:
    geomed = FedAvg(build_aggregator(CoordinatorSettings(aggregator="geometric_median")))
    rng = np.random.default_rng(5)
    initial = {"w": rng.normal(size=(3, 4)).astype(np.float32)}
    geomed.aggregate(0, [make_update(f"a{i}", 0, 10, weights=initial) for i in range(3)])  # bootstraps: no rule
    base = geomed.states["cnn"].digest
    geomed.begin_round(3, memory_budget_bytes=0, spill_dir=tmp_path)
    assert geomed.folds is None and geomed.rows is not None
    sent = [make_update(f"a{i}", 1, 10, delta={"w": rng.normal(size=(3, 4)).astype(np.float32)}, base=base)
            for i in range(3)]
    geomed.aggregate(1, [geomed.accumulate(u) for u in sent])
    step = geometric_median([u.delta for u in sent], [10.0] * 3)["w"].astype(np.float64)
    expected = (initial["w"].astype(np.float64) + step).astype(np.float32)
    np.testing.assert_array_equal(geomed.states["cnn"].weights["w"], expected)
    geomed.end_round()
    mean = FedAvg(build_aggregator(CoordinatorSettings(aggregator="mean")))
    mean.begin_round(3)
    assert mean.folds is not None and mean.rows is None


def test_working_memory_does_not_grow_with_the_number_of_updates() -> None:
    rng = np.random.default_rng(0)
    size = 1_000_000
    few = [{"w": rng.standard_normal(size, dtype=np.float32)} for _ in range(5)]
    many = few * 8
    small = peak_bytes(lambda: geometric_median(few, [1.0] * 5, iterations=2))
    large = peak_bytes(lambda: geometric_median(many, [1.0] * 40, iterations=2))
    assert large <= size * 4 + 10 * 2**20, large  # the output, one block and small change
    assert large <= small + 2**20, (small, large)


# -- clipping --------------------------------------------------------------------------------------


@FAST
@given(cases(min_active=2), st.floats(0.05, 2.0))
def test_clipping_scales_each_update_to_the_norm_bound_first(case: Case, fraction: float) -> None:
    norms = [math.sqrt(math.fsum(v * v for v in bf.vector(u))) for u in case.active]
    bound = max(fraction * max(norms), 1e-3)
    merged = geometric_median(case.updates, case.weights, iterations=4, tolerance=0.0, clip_norm=bound)
    expected, _ = reference(case.active, 4, 1e-6, 0.0, bound)
    assert_near(merged, expected, scale_of(case))
    # a convex combination of updates of norm <= bound
    assert np.linalg.norm(flat(merged)) <= bound * (1 + 1e-6) + 1e-6


# -- parameters, registry, settings ------------------------------------------------------------------


@pytest.mark.parametrize(("params", "reason"), [
    ({"iterations": 0}, "invalid_parameter"), ({"smoothing": 0.0}, "invalid_parameter"),
    ({"smoothing": math.nan}, "invalid_parameter"), ({"tolerance": -1e-3}, "invalid_parameter"),
    ({"f": -1}, "invalid_parameter"), ({"f": 2}, "too_few_updates"), ({"clip_norm": 0.0}, "invalid_parameter"),
])
def test_bad_parameters_fail_with_a_reason(params: dict[str, float], reason: str) -> None:
    with pytest.raises(AggregationError) as info:
        geometric_median([{"w": np.full(3, float(i))} for i in range(4)], [1.0] * 4, **params)  # type: ignore[arg-type]
    assert info.value.reason == reason


def test_the_registry_lists_it_and_build_aggregator_binds_its_settings() -> None:
    entry = RULES.entry("geometric_median")
    assert entry.value.fn is geometric_median and needs_individual_updates(entry)
    assert entry.settings == ("byzantine_f", "geomed_iterations", "geomed_smoothing", "geomed_tolerance", "clip_norm")
    settings = CoordinatorSettings(aggregator="geometric_median", byzantine_f=1, geomed_iterations=5,
                                   geomed_smoothing=1e-3, geomed_tolerance=0.0, clip_norm=3.0)
    aggregator = build_aggregator(settings)
    assert aggregator.describe() == "geometric_median(f=1, iterations=5, smoothing=0.001, tolerance=0.0, clip_norm=3.0)"
    assert aggregator.needs_individual_updates
    defaults = CoordinatorSettings()
    assert (defaults.geomed_iterations, defaults.geomed_smoothing, defaults.geomed_tolerance) == (
        DEFAULT_ITERATIONS, DEFAULT_SMOOTHING, DEFAULT_TOLERANCE)
    updates = random_updates(np.random.default_rng(6), 5)
    direct = geometric_median(updates, [1.0] * 5, f=1, iterations=5, smoothing=1e-3, tolerance=0.0, clip_norm=3.0)
    for name, array in aggregator(updates, [1.0] * 5).items():
        np.testing.assert_array_equal(array, direct[name])


@pytest.mark.parametrize(("field", "value"), [
    ("geomed_iterations", 0), ("geomed_iterations", 1001), ("geomed_smoothing", 0.0), ("geomed_smoothing", "nan"),
    ("geomed_tolerance", -0.1), ("geomed_tolerance", 1.0),
])
def test_bad_settings_fail_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        load_settings(CoordinatorSettings, overrides={"aggregator": "geometric_median", field: value})


def test_every_registered_rule_is_a_valid_setting_and_in_the_schema() -> None:
    names = RULES.names()
    assert names[0] == "mean" and "geometric_median" in names
    assert CoordinatorSettings.model_json_schema()["properties"]["aggregator"]["enum"] == list(names)
    for entry in RULES:
        settings = CoordinatorSettings(aggregator=entry.name)
        assert set(entry.settings) <= set(CoordinatorSettings.model_fields), entry.name
        aggregator = build_aggregator(settings)
        assert aggregator.name == entry.name and aggregator.rule is entry.value.fn
        assert aggregator.needs_individual_updates == (entry.name != "mean")
        merged = aggregator([{"w": np.full(2, float(i))} for i in range(5)], [1.0] * 5)
        assert merged["w"].shape == (2,)


def test_plain_rule_functions_keep_their_folding() -> None:
    assert not Aggregator("mean", weighted_mean).needs_individual_updates
    assert not Aggregator.of(weighted_mean).needs_individual_updates
    assert Aggregator("mean", weighted_mean, {"x": 1}).needs_individual_updates
    assert Aggregator("geomed", geometric_median).needs_individual_updates
