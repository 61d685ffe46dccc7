"""Krum and Multi-Krum (Blanchard et al., 2017): keep the updates closest to their neighbours.

Each update's score is the sum of its squared distances to its n - f - 2 nearest other
updates; Krum returns the update with the lowest score, Multi-Krum the plain mean of the m
lowest-scored. Ties go to the update that came first.

Sample weights are not used, beyond leaving out updates of weight zero: agents report their
own sample counts, so a Byzantine agent could claim any weight. Multi-Krum's mean is plain
(unweighted), as in the paper.

Distances come from a Gram matrix, ||a - b||^2 = ||a||^2 + ||b||^2 - 2<a, b>, accumulated
in float64 block by block (one matrix product per block instead of n^2 / 2 vector passes),
and clamped at zero: rounding can leave a tiny negative where two updates (nearly) coincide.
The absolute rounding error is about 1e-16 * (||a||^2 + ||b||^2).

``krum`` and ``multi_krum`` choose with ``krum_select.select_lowest``: distances from a float32
Gram matrix, and float64 scores (centred rows) for every row the float32 bounds cannot rule
out, so they choose the rows float64 scores choose, at about half the BLAS time.
``krum_scores`` computes every score in float64 (centred, as that check does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coordinator.aggregation.errors import AggregationError, FailureReason
from coordinator.aggregation.krum_select import exact_scores, select_lowest
from coordinator.aggregation.mean import mean_of_rows
from coordinator.aggregation.stack import NamedArrays, UpdateStack, check_f

GRAM_MIN_WIDTH = 2048
"""Columns per block at least (up to n): the buffer then stays under the n x n Gram matrix itself."""


def pairwise_squared_distances(stack: UpdateStack) -> np.ndarray:
    """(n, n) squared L2 distances between the rows (clipped, if the stack clips), float64."""
    n = stack.n
    gram = np.zeros((n, n))
    # Each block adds an n x n product into the Gram matrix: narrow blocks (the stack's budget
    # spread over many rows) would make that memory traffic, not the multiplication, the cost.
    width = max(stack.block_width(), min(GRAM_MIN_WIDTH, n))
    buffer = np.empty(width * n)
    for block in stack.blocks(width):
        rows = stack.read_rows(block, buffer)
        gram += rows @ rows.T  # numpy hands a @ a.T to BLAS syrk: half the products
    squares = np.diag(gram).copy()
    distances = squares[:, None] + squares[None, :] - 2.0 * gram
    np.maximum(distances, 0.0, out=distances)
    np.fill_diagonal(distances, 0.0)
    return distances


def _check_n(stack: UpdateStack, f: int) -> None:
    n = stack.n
    check_f(f)
    if n <= 2 * f + 2:
        raise AggregationError(FailureReason.TOO_FEW_UPDATES,
                               f"Krum tolerates f={f} Byzantine updates only with n > 2f + 2 = {2 * f + 2}, got n={n}")


def krum_scores(updates: Sequence[NamedArrays], weights: Sequence[float], *, f: int,
                clip_norm: float | None = None) -> np.ndarray:
    """Each update's Krum score, in input order; updates of weight zero score +inf (never chosen)."""
    stack = UpdateStack(updates, weights, clip_norm=clip_norm)
    _check_n(stack, f)
    scores = np.full(len(updates), np.inf)
    scores[stack.positions] = exact_scores(stack, np.arange(stack.n), stack.n - f - 2)
    return scores


def krum(updates: Sequence[NamedArrays], weights: Sequence[float], *, f: int,
         clip_norm: float | None = None) -> dict[str, np.ndarray]:
    """The update with the lowest Krum score (a copy; clipped if ``clip_norm``).

    Needs n > 2f + 2 updates of positive weight, else fails with ``too_few_updates``.
    Integer arrays come from the chosen update.
    """
    stack = UpdateStack(updates, weights, clip_norm=clip_norm)
    _check_n(stack, f)
    chosen = select_lowest(stack, f, 1).best
    return stack.in_order({**stack.row_copy(chosen), **stack.others_from(chosen)})


def multi_krum(updates: Sequence[NamedArrays], weights: Sequence[float], *, f: int, m: int | None = None,
               clip_norm: float | None = None) -> dict[str, np.ndarray]:
    """The plain mean of the ``m`` lowest-scored updates (float64 accumulation).

    ``m`` defaults to n - f, and may not exceed it (more would have to take in a Byzantine
    update). Needs n > 2f + 2, else fails with ``too_few_updates``. Integer arrays come from
    the best-scored update.
    """
    if m is not None and m < 1:
        raise AggregationError(FailureReason.INVALID_PARAMETER, f"Multi-Krum needs m >= 1, got {m}")
    stack = UpdateStack(updates, weights, clip_norm=clip_norm)
    _check_n(stack, f)
    n = stack.n
    count = n - f if m is None else m
    if count > n - f:
        raise AggregationError(FailureReason.TOO_FEW_UPDATES,
                               f"Multi-Krum averages m={count} updates, more than n - f = {n - f} (n={n}, f={f})")
    selection = select_lowest(stack, f, count)
    chosen = [int(i) for i in selection.chosen]  # in row order: the mean's sums do not depend on the scores' order
    merged = mean_of_rows(stack, np.ones(count), chosen, divisor=float(count))
    merged.update(stack.others_from(selection.best))
    return stack.in_order(merged)
