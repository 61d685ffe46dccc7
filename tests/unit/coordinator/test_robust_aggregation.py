"""Each robust rule against a brute-force implementation of its definition (property-based).

Inputs include ties (values drawn from a handful of small integers, duplicated updates),
even and odd n, zero weights, float32 and float64, scalars and integer arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coordinator.aggregation import coordinate_median, krum, krum_scores, multi_krum, trimmed_mean, weighted_mean
from tests.unit.coordinator import brute_force as bf

FAST = settings(deadline=None, max_examples=80)
TIES = [-2.0, -1.0, 0.0, 1.0, 3.0]


@dataclass
class Case:
    updates: list[dict[str, np.ndarray]]
    weights: list[float]
    ties: bool
    """Small-integer values: every sum and distance is exact in float64, so tie-breaking must match exactly."""

    @property
    def active(self) -> list[dict[str, np.ndarray]]:
        return bf.positive(self.updates, self.weights)

    @property
    def floats(self) -> list[str]:
        return bf.float_names(self.updates[0])


@st.composite
def cases(draw: st.DrawFn, min_active: int = 1) -> Case:
    n = draw(st.integers(max(min_active, 1), 9))
    names = draw(st.lists(st.sampled_from(["w", "b", "conv", "z"]), min_size=1, max_size=3, unique=True))
    shapes = {name: draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=4)) for name in names}
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    ties = draw(st.booleans())
    # Magnitudes of real models: zero, or about 1e-6 to 1e3 (float32 subnormals are no test of the rules).
    generic = st.just(0.0) | st.floats(2.0**-20, 1e3, width=32) | st.floats(-1e3, -(2.0**-20), width=32)
    elements = st.sampled_from(TIES) if ties else generic
    updates = [{name: draw(hnp.arrays(dtype, shape, elements=elements)) for name, shape in shapes.items()}
               for _ in range(n)]
    if draw(st.booleans()):  # an integer buffer, never averaged
        shape = draw(st.sampled_from([(), (2,)]))
        for update in updates:
            update["count"] = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, 5)))
    if n > 1 and draw(st.booleans()):  # an exact duplicate
        source, target = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        updates[target] = {k: v.copy() for k, v in updates[source].items()}
    weights = draw(st.lists(st.sampled_from([0.0, 1.0, 7.0, 1000.0]) | st.floats(0.5, 100.0), min_size=n, max_size=n))
    assume(sum(1 for w in weights if w > 0) >= min_active)
    return Case(updates, weights, ties)


def assert_close(actual: np.ndarray, expected: np.ndarray, scale: float) -> None:
    """float64 results to 1e-12 relative (plus 1e-12 of the inputs' scale); narrower floats to one
    ulp of the exact result rounded (plus the same 1e-12 of scale, for results that cancel to ~0)."""
    assert actual.shape == expected.shape
    if actual.dtype == np.float64:
        np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12 * scale)
    else:
        rounded = expected.astype(actual.dtype)
        allowed = np.spacing(np.abs(rounded)).astype(np.float64) + 1e-12 * scale
        assert (np.abs(actual.astype(np.float64) - rounded) <= allowed).all(), (actual, expected)


def scale_of(case: Case) -> float:
    return max([1.0] + [float(np.abs(u[name]).max()) for u in case.active for name in case.floats])


def assert_layout(merged: dict[str, np.ndarray], case: Case) -> None:
    """Same names in the same order, each an ndarray of its input's shape and dtype."""
    assert list(merged) == list(case.updates[0])
    for name, array in merged.items():
        reference = case.updates[0][name]
        assert isinstance(array, np.ndarray), (name, type(array))
        assert (array.shape, array.dtype) == (reference.shape, reference.dtype), name


def find_row(merged: dict[str, np.ndarray], rows: list[dict[str, np.ndarray]], names: list[str]) -> list[int]:
    return [i for i, row in enumerate(rows) if all(np.array_equal(merged[k], row[k]) for k in names)]


# -- coordinate-wise ----------------------------------------------------------------------------


@FAST
@given(cases())
def test_median_is_the_middle_value_or_the_mean_of_the_middle_two(case: Case) -> None:
    merged = coordinate_median(case.updates, case.weights)
    assert_layout(merged, case)
    for name in case.floats:
        expected = bf.per_coordinate(case.active, name, bf.median).astype(case.updates[0][name].dtype)
        assert merged[name].dtype == expected.dtype
        np.testing.assert_array_equal(merged[name], expected)  # a sort and one halving: exact
    if "count" in merged:
        np.testing.assert_array_equal(merged["count"], bf.lower_median_int(case.active, "count"))


@FAST
@given(cases(), st.sampled_from([0.0, 0.1, 0.2, 0.25, 1 / 3, 0.4, 0.49]))
def test_trimmed_mean_drops_floor_beta_n_at_each_end(case: Case, beta: float) -> None:
    k = math.floor(beta * len(case.active))
    merged = trimmed_mean(case.updates, case.weights, beta=beta)
    assert_layout(merged, case)
    for name in case.floats:
        assert merged[name].dtype == case.updates[0][name].dtype
        assert_close(merged[name], bf.per_coordinate(case.active, name, bf.trimmed(k)), scale_of(case))
    if "count" in merged:
        np.testing.assert_array_equal(merged["count"], bf.lower_median_int(case.active, "count"))


def test_trimmed_mean_without_trimming_is_the_plain_mean_whatever_the_weights() -> None:
    updates = [{"w": np.array([1.0, 10.0])}, {"w": np.array([2.0, 20.0])}, {"w": np.array([6.0, 0.0])}]
    np.testing.assert_allclose(trimmed_mean(updates, [1.0, 100.0, 5.0], beta=0.0)["w"], [3.0, 10.0])


# -- Krum -----------------------------------------------------------------------------------------


def krum_f(draw: st.DrawFn, case: Case) -> int:
    return draw(st.integers(0, (len(case.active) - 3) // 2))


@FAST
@given(cases(min_active=3), st.data())
def test_krum_scores_and_choice_match_the_definition(case: Case, data: st.DataObject) -> None:
    f = krum_f(data.draw, case)
    active = case.active
    expected = bf.krum_scores(active, f)
    norms = max(math.fsum(v * v for v in bf.vector(u)) for u in active)
    tolerance = 1e-9 * (1.0 + norms)
    scores = krum_scores(case.updates, case.weights, f=f)
    assert np.isinf(scores[[i for i, w in enumerate(case.weights) if w == 0]]).all()
    np.testing.assert_allclose(scores[np.isfinite(scores)], expected, rtol=0, atol=tolerance)

    merged = krum(case.updates, case.weights, f=f)
    assert_layout(merged, case)
    candidates = find_row(merged, active, case.floats)
    assert candidates, "Krum must return one of the updates"
    assert min(expected[i] for i in candidates) <= min(expected) + tolerance
    if case.ties:  # exact arithmetic: the first lowest score wins
        first = int(np.argmin(expected))
        assert first in candidates
        for name in merged:
            np.testing.assert_array_equal(merged[name], active[first][name])


@FAST
@given(cases(min_active=3), st.data())
def test_multi_krum_is_the_plain_mean_of_the_m_best_scored(case: Case, data: st.DataObject) -> None:
    f = krum_f(data.draw, case)
    active = case.active
    n = len(active)
    m = data.draw(st.none() | st.integers(1, n - f))
    expected_scores = bf.krum_scores(active, f)
    norms = max(math.fsum(v * v for v in bf.vector(u)) for u in active)
    tolerance = 1e-9 * (1.0 + norms)
    scores = krum_scores(case.updates, case.weights, f=f)[[i for i, w in enumerate(case.weights) if w > 0]]
    count = n - f if m is None else m
    chosen = list(np.argsort(scores, kind="stable")[:count])
    if case.ties:
        assert chosen == list(np.argsort(expected_scores, kind="stable")[:count])
    left_out = [i for i in range(n) if i not in chosen]
    assert all(expected_scores[i] <= expected_scores[j] + tolerance for i in chosen for j in left_out)

    merged = multi_krum(case.updates, case.weights, f=f, m=m)
    assert_layout(merged, case)
    for name in case.floats:
        assert_close(merged[name], bf.plain_mean([active[i] for i in chosen], name), scale_of(case))
    if "count" in merged:
        np.testing.assert_array_equal(merged["count"], active[chosen[0]]["count"])


def test_krum_takes_integer_arrays_from_the_chosen_update() -> None:
    honest = [{"w": np.array([0.0 + 0.1 * i]), "n": np.array([i])} for i in range(4)]
    outlier = {"w": np.array([100.0]), "n": np.array([99])}
    merged = krum([outlier, *honest], [1e6, 1, 1, 1, 1], f=1)  # the outlier's huge weight buys it nothing
    assert merged["w"][0] in (0.1, 0.2) and merged["n"][0] in (1, 2)
    assert merged["n"][0] == round(merged["w"][0] * 10)


# -- clipping ------------------------------------------------------------------------------------


RULES = {
    "mean": lambda u, w, **kw: weighted_mean(u, w, **kw),
    "median": lambda u, w, **kw: coordinate_median(u, w, **kw),
    "trimmed_mean": lambda u, w, **kw: trimmed_mean(u, w, beta=0.2, **kw),
}


def clip_bound(case: Case, fraction: float) -> float:
    """A bound that clips some updates, usually not all."""
    norms = sorted(math.sqrt(math.fsum(v * v for v in bf.vector(u))) for u in case.active)
    assume(norms[-1] > 0)
    return fraction * norms[len(norms) // 2] or norms[-1] / 2


@FAST
@given(cases(min_active=3), st.sampled_from(sorted(RULES)), st.floats(0.05, 2.0))
def test_clipping_scales_each_update_to_the_norm_bound_first(case: Case, rule: str, fraction: float) -> None:
    bound = clip_bound(case, fraction)
    merged = RULES[rule](case.updates, case.weights, clip_norm=bound)
    reference = RULES[rule](bf.clip(case.active, bound), [w for w in case.weights if w > 0])
    for name in case.floats:
        assert merged[name].dtype == case.updates[0][name].dtype
        tolerance = 1e-12 if merged[name].dtype == np.float64 else 2e-6
        np.testing.assert_allclose(merged[name], reference[name].astype(merged[name].dtype), rtol=tolerance,
                                   atol=tolerance * bound)
    for name in set(merged) - set(case.floats):
        np.testing.assert_array_equal(merged[name], reference[name])


@FAST
@given(cases(min_active=3), st.floats(0.05, 2.0), st.data())
def test_krum_with_clipping_scores_and_chooses_among_the_clipped_updates(case: Case, fraction: float,
                                                                         data: st.DataObject) -> None:
    # Clipping maps updates onto one sphere, which makes exact and near ties common: check
    # that each choice is a valid one (within rounding), not which of equals was taken.
    bound = clip_bound(case, fraction)
    f = krum_f(data.draw, case)
    clipped = bf.clip(case.active, bound)
    expected = bf.krum_scores(clipped, f)
    tolerance = 1e-9 * (1.0 + bound ** 2) * len(clipped)
    scores = krum_scores(case.updates, case.weights, f=f, clip_norm=bound)
    np.testing.assert_allclose(scores[np.isfinite(scores)], expected, rtol=0, atol=tolerance)

    chosen = int(np.argmin(scores[np.isfinite(scores)]))
    assert expected[chosen] <= min(expected) + tolerance
    merged = krum(case.updates, case.weights, f=f, clip_norm=bound)
    for name in case.floats:
        np.testing.assert_allclose(merged[name], clipped[chosen][name].astype(merged[name].dtype), rtol=2e-6,
                                   atol=2e-6 * bound)

    m = data.draw(st.integers(1, len(clipped) - f))
    best = list(np.argsort(scores[np.isfinite(scores)], kind="stable")[:m])
    others = [i for i in range(len(clipped)) if i not in best]
    assert all(expected[i] <= expected[j] + tolerance for i in best for j in others)
    merged = multi_krum(case.updates, case.weights, f=f, m=m, clip_norm=bound)
    for name in case.floats:
        mean = bf.plain_mean([clipped[i] for i in best], name)
        np.testing.assert_allclose(merged[name], mean.astype(merged[name].dtype), rtol=2e-6, atol=2e-6 * bound)


def test_clipping_never_scales_up_and_bounds_the_mean() -> None:
    small, large = {"w": np.array([0.3, 0.4])}, {"w": np.array([30.0, 40.0])}  # norms 0.5 and 50
    merged = weighted_mean([small, large], [1.0, 1.0], clip_norm=1.0)
    np.testing.assert_allclose(merged["w"], (np.array([0.3, 0.4]) + np.array([0.6, 0.8])) / 2)
