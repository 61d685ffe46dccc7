"""Krum's O(n d) bounds (krum_sums.py): they hold every float64 score, and the choice they settle is float64's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.aggregation import krum, multi_krum
from coordinator.aggregation import krum_select as ks
from coordinator.aggregation import krum_sums as sums
from coordinator.aggregation.stack import UpdateStack
from tests.unit.coordinator.test_krum_select import near_tie, read_path, reference_scores


@pytest.fixture
def no_gram(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float32 Gram matrix fails if used: whatever is chosen, the sums settled it."""
    def refuse(stack: UpdateStack) -> None:
        raise AssertionError("the Gram matrix was computed: the sum bounds did not settle the choice")
    monkeypatch.setattr(ks, "_float32_gram", refuse)


def fleet(seed: int, n: int, d: int, attackers: int, scale: float = 40.0) -> np.ndarray:
    """Honest rows around a shared offset, ``attackers`` rows far off (float32)."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=d) + 0.1 * rng.normal(size=(n, d))
    rows[:attackers] += scale * rng.normal(size=(attackers, d))
    return rows.astype(np.float32)


@pytest.mark.parametrize("seed", range(8))
def test_the_bounds_hold_every_float64_score(seed: int) -> None:
    n, d = 72 + 16 * seed, 900 + 100 * seed
    f = seed % 4
    rows = fleet(seed, n, d, attackers=seed % 3, scale=[1.0, 40.0, 1e3][seed % 3])
    if seed % 2:
        rows[3] = rows[10]  # clones score alike
    bounds = sums.sum_bounds(UpdateStack([{"v": r} for r in rows], [1.0] * n), f)
    assert bounds is not None
    lower, upper = bounds.lower, bounds.upper
    expected = reference_scores(rows, f)
    slack = 1e-12 * expected.max()
    assert (lower <= expected + slack).all() and (expected <= upper + slack).all()
    assert (lower <= upper).all()


def test_far_attackers_leave_few_rows_open() -> None:
    n, d, f = 400, 2000, 4
    rows = fleet(1, n, d, attackers=f, scale=1e3)
    bounds = sums.sum_bounds(UpdateStack([{"v": r} for r in rows], [1.0] * n), f)
    assert bounds is not None
    open_rows = np.flatnonzero(bounds.lower <= bounds.upper.min())
    assert 1 <= len(open_rows) <= ks.SUM_CANDIDATES
    assert int(np.argmin(reference_scores(rows, f))) in open_rows


def test_large_f_leaves_it_to_the_gram_matrix() -> None:
    n = 80
    assert sums.pivot_count(n, 1) == 1 + 1 + sums.EXTRA_PIVOTS
    assert sums.pivot_count(n, n // 4) is None
    rows = fleet(2, n, 500, attackers=2)
    assert sums.sum_bounds(UpdateStack([{"v": r} for r in rows], [1.0] * n), n // 4) is None
    assert ks.select_lowest(UpdateStack([{"v": r} for r in rows], [1.0] * n), n // 4, 1).best == int(
        np.argmin(reference_scores(rows, n // 4)))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gap", [1e-3, 1e-6])
def test_near_ties_are_settled_by_the_sums_as_float64_would(no_gram: None, seed: int, gap: float) -> None:
    n, d, f = 160 + 8 * seed, 2000, 2
    rows, _, _ = near_tie(seed, n, d, gap)
    expected = reference_scores(rows, f)
    order = np.argsort(expected, kind="stable")
    assert expected[order[1]] - expected[order[0]] < 1e-4 * expected[order[0]]
    updates = [{"w": r[:1200].reshape(30, 40), "b": r[1200:]} for r in rows]
    stack = UpdateStack(updates, [1.0] * n)
    assert ks.select_lowest(stack, f, 1).best == int(order[0])
    np.testing.assert_array_equal(krum(updates, [1.0] * n, f=f)["b"], rows[order[0]][1200:])
    np.testing.assert_array_equal(ks.select_lowest(stack, f, n - f).chosen, np.sort(order[:n - f]))


@pytest.mark.parametrize("kind", ["clipped", "float64", "spilled"])
def test_every_read_path_settles_as_float64_does(no_gram: None, tmp_path: Path, kind: str) -> None:
    n, d, f = 120, 1500, 3
    rows = fleet(7, n, d, attackers=f, scale=50.0).astype(np.float64 if kind == "float64" else np.float32)
    clip = 40.0 if kind == "clipped" else None
    effective, updates = read_path(rows, kind, clip, tmp_path)
    expected = reference_scores(effective, f)
    picked = np.sort(np.argsort(expected, kind="stable")[:n - f])
    stack = UpdateStack(updates, [1.0] * n, clip_norm=clip)
    assert ks.select_lowest(stack, f, 1).best == int(np.argmin(expected))
    np.testing.assert_array_equal(ks.select_lowest(stack, f, n - f).chosen, picked)
    merged = multi_krum(updates, [1.0] * n, f=f, clip_norm=clip)
    np.testing.assert_allclose(merged["v"], effective[picked].mean(axis=0).astype(rows.dtype), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("second_pass_scores", [True, False])
def test_a_fleet_of_clones_is_settled_with_one_score_per_distinct_row(no_gram: None, monkeypatch: pytest.MonkeyPatch,
                                                                     second_pass_scores: bool) -> None:
    """Eight distinct updates sent by 200 agents (as the scale bench's fleet does): the first of the best clones.
    The second pass scores one row of each run of equal T_i, so no third pass is needed; without its
    scores, the third pass scores one row per distinct update, not one per agent."""
    if not second_pass_scores:
        monkeypatch.setattr(ks, "_known", lambda first_of, scored: None)
    rng = np.random.default_rng(3)
    variants = (rng.normal(size=3000) + 0.1 * rng.normal(size=(8, 3000))).astype(np.float32)
    rows = variants[np.arange(200) % 8]
    scored: list[int] = []
    exact = ks.exact_scores
    monkeypatch.setattr(ks, "exact_scores", lambda stack, which, k: scored.append(len(which)) or exact(stack, which, k))
    expected = reference_scores(rows, 1)
    assert ks.select_lowest(UpdateStack([{"v": r} for r in rows], [1.0] * 200), 1, 1).best == int(np.argmin(expected))
    if second_pass_scores:
        assert scored == []
    else:
        assert scored and max(scored) <= 8


def test_distinct_rows_are_scored_in_the_second_pass(no_gram: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Honest rows near a shared offset: the rows the bounds leave open are among those the second pass
    scored (the least T_i), so nothing reads the rows a third time. (With attackers far off, T_i's order
    follows their directions, and a third pass often scores the open rows.)"""
    def refuse(*args: object) -> None:
        raise AssertionError("a third pass over the rows")
    monkeypatch.setattr(ks, "exact_scores", refuse)
    n, d, f = 300, 2000, 3
    rows = fleet(9, n, d, attackers=0)
    expected = reference_scores(rows, f)
    stack = UpdateStack([{"v": r} for r in rows], [1.0] * n)
    assert ks.select_lowest(stack, f, 1).best == int(np.argmin(expected))


def test_rows_equal_in_their_first_block_only_are_told_apart() -> None:
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(40, 5000)).astype(np.float32)
    rows[1::2, :2000] = rows[0, :2000]  # same first columns as row 0, different after
    rows[6] = rows[0]
    rows[9] = rows[3]
    stack = UpdateStack([{"v": r} for r in rows], [1.0] * 40, block_bytes=8 * 40 * 1024)  # blocks of 1,024 columns
    first = ks._first_equal_rows(stack, np.arange(40))
    expected = {i: next(j for j in range(40) if np.array_equal(rows[j], rows[i])) for i in range(40)}
    assert first == expected
    assert first[6] == 0 and first[9] == 3 and first[1] == 1
