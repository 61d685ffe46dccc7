"""Krum from a float32 Gram matrix chooses exactly what plain float64 Krum chooses, near-ties included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.aggregation import krum, multi_krum
from coordinator.aggregation import krum_select as ks
from coordinator.aggregation.rows import RowMatrix
from coordinator.aggregation.stack import UpdateStack


def reference_scores(rows: np.ndarray, f: int) -> np.ndarray:
    """Plain float64 Krum scores: direct differences, no Gram matrix, no centring."""
    x = rows.astype(np.float64)
    n = len(x)
    distances = np.array([[np.sum((x[i] - x[j]) ** 2) for j in range(n)] for i in range(n)])
    np.fill_diagonal(distances, np.inf)
    return np.sort(distances, axis=1)[:, :n - f - 2].sum(axis=1)


def near_tie(seed: int, n: int, d: int, gap: float, dtype: type = np.float32) -> tuple[np.ndarray, int, int]:
    """Honest rows around a common offset, two Byzantine far away, and a row next to the best one
    whose score differs from it by about ``gap`` (relative): float32 alone cannot tell them apart."""
    rng = np.random.default_rng(seed)
    offset = rng.normal(size=d)  # the updates' shared direction: centring must take it out
    rows = offset + 0.05 * rng.normal(size=(n, d))
    rows[-2:] += 40.0 * rng.normal(size=(2, d))
    rows = rows.astype(dtype)
    scores = reference_scores(rows, 2)
    best = int(np.argmin(scores))
    twin = int(np.argsort(scores)[1]) if seed % 2 else n - 3
    direction = rng.normal(size=d)
    rows[twin] = (rows[best].astype(np.float64) + gap * 0.05 * direction / np.linalg.norm(direction)).astype(dtype)
    return rows, best, twin


def read_path(rows: np.ndarray, kind: str, clip: float | None, tmp_path: Path) -> tuple[np.ndarray, list]:
    """The rows as Krum should see them (float64, clipped to ``clip``), and as updates for ``kind``'s read
    path: one dict each, or rows of a RowMatrix spilled to disk for "spilled"."""
    effective = rows.astype(np.float64)
    if clip is not None:
        effective = effective * np.minimum(1.0, clip / np.linalg.norm(effective, axis=1))[:, None]
    updates: list = [{"v": r} for r in rows]
    if kind == "spilled":
        matrix = RowMatrix(updates[0], len(rows), budget_bytes=0, spill_dir=tmp_path)
        updates = [matrix.append(u) for u in updates]
        assert matrix.spilled
    return effective, updates


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gap", [1e-3, 1e-5])
def test_the_chosen_row_is_the_float64_choice_at_near_ties(seed: int, gap: float) -> None:
    n, d, f = 48 + 8 * seed, 3000, 2
    rows, _, _ = near_tie(seed, n, d, gap)
    expected = reference_scores(rows, f)
    order = np.argsort(expected, kind="stable")
    lowest, second = expected[order[0]], expected[order[1]]
    assert second - lowest < 1e-4 * lowest, "the data must hold a tie float32's bound cannot settle"
    assert second > lowest * (1 + 1e-12), "and one float64 can"
    updates = [{"w": r[:2000].reshape(40, 50), "b": r[2000:]} for r in rows]
    stack = UpdateStack(updates, [1.0] * n)
    assert stack.n >= ks.FAST_MIN_ROWS
    selection = ks.select_lowest(stack, f, 1)
    assert selection.best == int(order[0])
    merged = krum(updates, [float(i + 1) for i in range(n)], f=f)
    np.testing.assert_array_equal(merged["b"], rows[order[0]][2000:])
    for count in (1, n // 2, n - f):
        chosen = ks.select_lowest(stack, f, count).chosen
        np.testing.assert_array_equal(chosen, np.sort(order[:count]), err_msg=f"m={count}")


@pytest.mark.parametrize("kind", ["clipped", "float64", "spilled", "duplicates", "huge"])
def test_every_read_path_chooses_as_float64_does(tmp_path: Path, kind: str) -> None:
    n, d, f = 40, 1500, 3
    rows, _, _ = near_tie(11, n, d, 1e-6, np.float64 if kind == "float64" else np.float32)
    if kind == "duplicates":  # an exact tie: the first of equals wins, as np.argmin's
        rows[5] = rows[int(np.argmin(reference_scores(rows, f)))]
    if kind == "huge":  # squares past float32's range: every score in float64
        rows[-1] = 1e30
    clip = 30.0 if kind == "clipped" else None
    effective, updates = read_path(rows, kind, clip, tmp_path)
    expected = reference_scores(effective, f)
    stack = UpdateStack(updates, [1.0] * n, clip_norm=clip)
    assert stack.exact_in_float32 == (kind in ("spilled", "duplicates", "huge"))
    assert ks.select_lowest(stack, f, 1).best == int(np.argmin(expected))
    m = n // 2
    np.testing.assert_array_equal(ks.select_lowest(stack, f, m).chosen, np.sort(np.argsort(expected, kind="stable")[:m]))
    merged = multi_krum(updates, [1.0] * n, f=f, m=m, clip_norm=clip)
    picked = np.sort(np.argsort(expected, kind="stable")[:m])
    np.testing.assert_allclose(merged["v"], effective[picked].mean(axis=0).astype(rows.dtype), rtol=1e-6, atol=1e-30)


def test_far_attackers_do_not_widen_the_bounds() -> None:
    """Rows a long way off have large distances, and large bounds only on those: few candidates."""
    rng = np.random.default_rng(5)
    n, d, f = 200, 2000, 20
    rows = (rng.normal(size=d) + 0.1 * rng.normal(size=(n, d))).astype(np.float32)
    rows[:f] *= 1e4
    stack = UpdateStack([{"v": r} for r in rows], [1.0] * n)
    gram, eps, tiny = ks._float32_gram(stack)
    lower, upper = ks._score_bounds(gram, eps, tiny, n - f - 2, stack.columns)
    expected = reference_scores(rows, f)
    assert (lower <= expected * (1 + 1e-12)).all() and (expected <= upper * (1 + 1e-12)).all()
    assert len(np.flatnonzero(lower <= upper.min())) <= 5
