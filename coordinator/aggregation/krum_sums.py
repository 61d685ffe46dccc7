"""Krum's scores bounded in O(n d) when f is small: every distance summed at once, only the f + 1 largest unknown.

A Krum score S_i sums the k = n - f - 2 smallest of row i's n - 1 squared distances: all of
them, T_i, less the f + 1 largest, M_i. T_i needs no pairwise products. With y the rows
(centred per column block, which changes no distance) and s = sum_j y_j:

    T_i = sum_j |y_i - y_j|^2 = n |y_i|^2 + sum_j |y_j|^2 - 2 y_i . s

one pass over the rows, whose cost grows with n d, not n^2 d. M_i is bounded with pivots: the
p = f + 1 + ``EXTRA_PIVOTS`` rows farthest from the blocks' centres (where far-off attackers
sit) have their distances to every row computed (an n x p product, a second pass). The f + 1
largest of those are a lower bound on M_i; every other row lies within rho (the largest
distance of a non-pivot from a hub: the centres, or the rows' mean) of the hub, so its
distance to row i is at most (r_i + rho)^2, which gives the upper bound. S_i then lies in [T_i - upper, T_i - lower], widened by a worst-case
bound on float64 rounding (of these sums and of the scores ``exact_scores`` computes).

While f is small next to n, M_i is a small part of S_i and the bounds leave a handful of rows
to score exactly. The second pass scores some rows outright (``SumBounds.scored``: the pivots and
the rows of least T_i, where the open rows usually are); only when the open rows are not among
them does a third pass score them. So Krum at 1,000 x 127k reads the rows two or three times in
float64 instead of computing a 1,000 x 1,000 Gram matrix. With f near n / 2 they leave many, and
``krum_select`` falls back to the float32 Gram matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coordinator.aggregation.stack import UpdateStack

EXTRA_PIVOTS = 8
"""Pivots beyond the f + 1 a lower bound needs: attackers beyond f, or near-ties in distance, still land there."""
PIVOT_SHARE = 8
"""Bounds from sums only while the pivots are at most 1 / PIVOT_SHARE of the rows (else the Gram is as cheap)."""
CENTRE_SAMPLE = 31
"""Rows (evenly spaced) whose coordinate-wise median centres each block: a minority cannot move it far."""
BLOCK_BYTES = 32 * 1024 * 1024
"""float64 working set of one block of all rows (4,096 columns at 1,000 rows): few blocks, bounded memory."""
GUESSES = 32
"""Rows of least T_i (beside the pivots, one per run of equal T_i) whose float64 scores the second pass computes."""
ROUNDING_SAFETY = 8.0
"""Factor on the worst-case float64 rounding bound (it is already a worst case; this is headroom)."""


def centre(values: np.ndarray) -> np.ndarray:
    """Per column, the median of a sample of the rows (in column chunks: np.median copies its input)."""
    sample = values[::max(1, len(values) // CENTRE_SAMPLE)][:CENTRE_SAMPLE]
    middle = np.empty(values.shape[1], dtype=values.dtype)
    for start in range(0, values.shape[1], 4096):
        middle[start:start + 4096] = np.median(sample[:, start:start + 4096], axis=0)
    return middle


def k_smallest_sums(values: np.ndarray, k: int) -> np.ndarray:
    """Per row, the sum of its k smallest values (float64)."""
    return np.partition(values, k - 1, axis=1)[:, :k].sum(axis=1)


def k_largest_sums(values: np.ndarray, k: int) -> np.ndarray:
    """Per row, the sum of its k largest values (float64)."""
    columns = values.shape[1]
    return np.partition(values, columns - k, axis=1)[:, columns - k:].sum(axis=1)


def pivot_count(n: int, f: int) -> int | None:
    """Pivots the bounds need for n rows and f, or None where the Gram matrix is the better tool."""
    pivots = f + 1 + EXTRA_PIVOTS
    return pivots if pivots * PIVOT_SHARE <= n else None


@dataclass(frozen=True)
class SumBounds:
    lower: np.ndarray
    upper: np.ndarray
    """[L_i, U_i] around each row's float64 Krum score."""
    scored: dict[int, float]
    """Float64 scores of the rows whose distances to every row the second pass computed (the pivots, and
    the ``GUESSES`` rows of least T_i, where the open rows almost always are): then no third pass is needed."""


def sum_bounds(stack: UpdateStack, f: int) -> SumBounds | None:
    """Bounds on every row's float64 Krum score (see the module docstring), and some scores outright; None
    when f is too large next to n for the bounds to pay."""
    n = stack.n
    pivots = pivot_count(n, f)
    if pivots is None:
        return None
    excluded = f + 1
    width = stack.block_width(budget=max(stack.block_bytes, BLOCK_BYTES))
    buffer = np.empty(width * n)
    squares, dots = np.zeros(n), np.zeros(n)  # |y_i|^2 and y_i . s, summed over blocks
    sum_square = 0.0  # |s|^2
    centres = []
    for block in stack.blocks(width):
        rows = stack.read_rows(block, buffer)
        centres.append(centre(rows))
        rows -= centres[-1]
        column_sums = rows.sum(axis=0)
        squares += np.einsum("ij,ij->i", rows, rows)
        dots += rows @ column_sums
        sum_square += float(column_sums @ column_sums)
    total = squares.sum()
    gamma = ROUNDING_SAFETY * 1.01 * (stack.columns + n + 64) * 2.0 ** -53
    # Two hubs for the triangle bound, each radius rounded up past its rounding: the blocks'
    # centres (y = 0, robust: attackers far off barely move a median) and the rows' mean
    # (closer where the rows spread evenly; it cancels where a row sits at the mean).
    from_centre = np.sqrt(squares * (1.0 + 4.0 * gamma))
    from_mean_squared = squares - 2.0 * dots / n + sum_square / n ** 2
    from_mean_squared += gamma * 4.0 * (squares + 2.0 * np.abs(dots) / n + sum_square / n ** 2 + total / n)
    from_mean = np.sqrt(np.maximum(from_mean_squared, 0.0))
    chosen = np.argsort(-from_centre, kind="stable")[:pivots]
    others = np.ones(n, dtype=bool)
    others[chosen] = False
    if not others.any():
        return None
    farthest_other_distance = np.minimum((from_centre + from_centre[others].max()) ** 2,
                                         (from_mean + from_mean[others].max()) ** 2)

    everything = n * squares + total - 2.0 * dots
    guesses = _least_distinct(everything, chosen, GUESSES)
    columns = np.concatenate([chosen, guesses])
    cross = np.zeros((n, len(columns)))
    for block, middle in zip(stack.blocks(width), centres, strict=True):
        rows = stack.read_rows(block, buffer)
        rows -= middle
        cross += rows @ rows[columns].T
    distances = squares[:, None] + squares[columns][None, :] - 2.0 * cross
    np.maximum(distances, 0.0, out=distances)
    scored = _scores_of_columns(distances, columns, n - f - 2)
    to_pivots = distances[:, :pivots]
    to_pivots[chosen, np.arange(pivots)] = 0.0  # a row is not its own neighbour (a zero never raises a top sum)
    least_largest = k_largest_sums(to_pivots, excluded)
    farthest_other = np.repeat(farthest_other_distance[:, None], excluded, axis=1)
    most_largest = k_largest_sums(np.concatenate([to_pivots, farthest_other], axis=1), excluded)

    magnitude = n * squares + total + excluded * (squares + squares.max())
    margin = gamma * 8.0 * magnitude  # T_i's, the pivot distances' and exact_scores' rounding, with room
    lower = np.maximum(everything - most_largest - margin, 0.0)
    upper = everything - least_largest + margin
    if not (np.isfinite(lower).all() and np.isfinite(upper).all()):
        return None
    return SumBounds(lower, upper, scored)


def _least_distinct(values: np.ndarray, skip: np.ndarray, count: int) -> np.ndarray:
    """Up to ``count`` rows of least value, not in ``skip``, one per run of (nearly) equal values: equal rows
    (clones: the bench's fleet, or attackers all sending one crafted update, as ALIE's do) share one score."""
    picked: list[int] = []
    last = None
    skipped = set(skip.tolist())
    for row in np.argsort(values, kind="stable").tolist():
        if row in skipped or (last is not None and abs(values[row] - last) <= 1e-12 * abs(last)):
            continue
        picked.append(row)
        last = values[row]
        if len(picked) == count:
            break
    return np.array(picked, dtype=np.int64)


def _scores_of_columns(distances: np.ndarray, rows: np.ndarray, k: int) -> dict[int, float]:
    """Row rows[c] -> the sum of the k smallest of column c (its distances to every row, itself left out):
    its float64 score, computed as ``krum_select.exact_scores`` computes one."""
    own = distances[rows, np.arange(len(rows))].copy()
    distances[rows, np.arange(len(rows))] = np.inf
    scores = k_smallest_sums(distances.T, k)
    distances[rows, np.arange(len(rows))] = own
    return dict(zip(rows.tolist(), scores.tolist(), strict=True))
