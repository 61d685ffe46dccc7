"""Krum's choice from bounds on every score, confirmed in float64: the rows float64 scores choose, at a fraction of the cost.

First, while f is small next to n, the scores are bounded from row sums in O(n d)
(``krum_sums.py``: every distance summed at once, pivots bounding the f + 1 largest). If those
bounds leave more than ``SUM_CANDIDATES`` (or n / 16) distinct rows open, the bounds come from
a float32 Gram matrix instead. Either way the rows left open get float64 scores (step 3).

The Gram matrix needs every pairwise distance: n^2 / 2 dot products of d values (1,000 x 127k:
6.4e10 multiply-adds). They run in float32 (BLAS syrk, twice float64's speed), and float64
settles every choice they cannot:

1. Each column block of the rows (clipped as read) is centred at a per-column reference (the
   coordinate-wise median of a sample of rows: distances do not change, and rounding then
   scales with the distances rather than with the updates' common offset), rounded to float32
   (float32 rows, unclipped, are centred in float32: one rounding of the exact difference) and
   multiplied with itself; the n x n products are summed in float64.
2. That Gram matrix G~ is within eps * |x_i| |x_j| (+ a tiny absolute term for float32's
   subnormals) of the exact one, eps = 1.01 ((W + 2) u32 + (B + 2) u64) for blocks of W columns
   (any float32 summation order of W terms errs by at most ~W u32 of the sum of |terms|,
   Cauchy-Schwarz bounds that by |x_i| |x_j|), plus a margin for float64's own rounding. So each
   distance d_ij is within e_ij = eps (|x_i| + |x_j|)^2 (+ the absolute term) of d~_ij, and
   each score S_i (sum of the k = n - f - 2 smallest d_ij) lies in [L_i, U_i]: the sums of the k
   smallest of max(d~_ij - e_ij, 0) and of d~_ij + e_ij.
3. Rows whose interval can still hold the lowest score (L_i <= min U) are Krum's candidates;
   for Multi-Krum's m lowest, rows that could fall either side of the cut are too. Their scores
   are computed again in float64 (one product of all rows with the candidates' columns, centred
   the same way; candidates with equal values, by a hash of them, share one), and the choice is
   made from those. A row left out has an exact score strictly
   above the winner's, so the result is the float64 result, ties going to the first row.

The bound is a worst case, so few rows are candidates only while the scores are apart by more
than ~eps (about 1.2e-4 relative at W = 2048); near-ties cost more float64 work, never a
different answer. Below ``FAST_MIN_ROWS`` rows, or if float32 overflows (values beyond ~1e19),
every score is computed in float64.

Memory: the float64 n x n Gram matrix and one float32 n x n product (12 n^2 bytes: 1.2 GB at
n = 10,000), one block of rows, and row chunks of the distance matrix for the bounds.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from coordinator.aggregation.krum_sums import centre, k_smallest_sums, sum_bounds
from coordinator.aggregation.stack import UpdateStack

FLOAT32_BLOCK = 2048
"""Columns per float32 product: eps grows with it, the n x n additions shrink with it."""
HASHED_CANDIDATES = 16
"""More candidates than this are grouped by equal values (a hash) before their float64 scores."""
FAST_MIN_ROWS = 32
"""Below this many rows every score is computed in float64 (cheap there, and no bound to trust)."""
SUM_CANDIDATES = 32
"""Distinct rows the O(n d) bounds (krum_sums.py) may leave for float64 scores (or n / 16) before the Gram takes over."""
BOUND_CHUNK_BYTES = 32 * 1024 * 1024
"""Row chunk of the n x n distance bounds."""
U32, U64 = 2.0 ** -24, 2.0 ** -53
FLOAT64_MARGIN = 2.0 ** -30
"""Added to eps: covers the float64 arithmetic of the bounds and of the check, with room to spare."""


@dataclass(frozen=True)
class Selection:
    best: int
    """The row with the lowest score (the first of equals)."""
    chosen: np.ndarray
    """The ``count`` lowest-scored rows (ties to the first), in row order."""


def select_lowest(stack: UpdateStack, f: int, count: int) -> Selection:
    """The ``count`` rows with the lowest Krum scores, as float64 scores would choose them."""
    n = stack.n
    k = n - f - 2
    if n < FAST_MIN_ROWS:
        return _from_exact(stack, k, count)
    from_sums = sum_bounds(stack, f)  # O(n d): settles it while f is small next to n
    if from_sums is not None:
        selection = _settle(stack, from_sums.lower, from_sums.upper, k, count, limit=max(SUM_CANDIDATES, n // 16),
                            scored=from_sums.scored)
        if selection is not None:
            return selection
    gram, eps, absolute = _float32_gram(stack)
    if not np.isfinite(gram).all():
        return _from_exact(stack, k, count)
    lower, upper = _score_bounds(gram, eps, absolute, k, stack.columns)
    del gram
    return _settle(stack, lower, upper, k, count, limit=n // 2) or _from_exact(stack, k, count)


def _settle(stack: UpdateStack, lower: np.ndarray, upper: np.ndarray, k: int, count: int, *,
            limit: int, scored: dict[int, float] | None = None) -> Selection | None:
    """The choice from scores bounded by [lower, upper]: float64 scores for every row the bounds
    leave open (from ``scored`` when it holds a row equal to each, else all computed here); None if
    more than ``limit`` distinct rows would need one."""
    candidates = np.flatnonzero(lower <= upper.min())
    if count == 1:
        sure, unsure = np.empty(0, dtype=np.int64), candidates
    else:
        # i surely ranks among the first `count` if fewer than `count` others could score <= S_i;
        # surely not if at least `count` others score strictly below any value S_i can take.
        could_precede = np.searchsorted(np.sort(lower), upper, side="right") - (lower <= upper)
        surely_precede = np.searchsorted(np.sort(upper), lower, side="left")
        sure = np.flatnonzero(could_precede < count)
        unsure = np.flatnonzero((could_precede >= count) & (surely_precede < count))
    checked = np.union1d(candidates, unsure)
    # Equal rows score alike: one float64 score each (many candidates are usually clones).
    first_of = _first_equal_rows(stack, checked) if len(checked) > HASHED_CANDIDATES else {
        int(i): int(i) for i in checked}
    distinct = np.unique(list(first_of.values()))
    if len(distinct) > limit:
        return None
    by_row = _known(first_of, scored or {}) or dict(
        zip(distinct.tolist(), exact_scores(stack, distinct, k).tolist(), strict=True))
    exact = {i: by_row[first] for i, first in first_of.items()}
    best = min(candidates.tolist(), key=lambda i: (exact[i], i))
    if count == 1:
        return Selection(best, np.array([best]))
    wanted = count - len(sure)  # the rest of the first `count` are the lowest (score, row) among the unsure
    if not 0 <= wanted <= len(unsure):
        raise RuntimeError(f"Krum's bounds are inconsistent: {len(sure)} sure, {len(unsure)} unsure, {count} wanted")
    extra = sorted(unsure.tolist(), key=lambda i: (exact[i], i))[:wanted]
    return Selection(best, np.sort(np.concatenate([sure, np.array(extra, dtype=np.int64)])))


def _known(first_of: dict[int, int], scored: dict[int, float]) -> dict[int, float] | None:
    """First of equals -> a score from ``scored`` (any of its equals'); None unless every one has one (the
    scores compared are then all computed one way)."""
    known: dict[int, float] = {}
    for row, first in first_of.items():
        if row in scored:
            known.setdefault(first, scored[row])
    return known if set(known) == set(first_of.values()) else None


def exact_scores(stack: UpdateStack, rows: np.ndarray, k: int) -> np.ndarray:
    """Krum scores of ``rows`` (indices) in float64: centred Gram columns against every row."""
    n = stack.n
    cross = np.zeros((n, len(rows)))
    squares = np.zeros(n)
    width = stack.block_width(budget=max(stack.block_bytes, 8 * n * FLOAT32_BLOCK))
    buffer = np.empty(width * n)
    everything = np.array_equal(rows, np.arange(n))
    for block in stack.blocks(width):
        values = stack.read_rows(block, buffer)
        values -= centre(values)
        squares += np.einsum("ij,ij->i", values, values)
        cross += values @ (values if everything else values[rows]).T  # all rows: BLAS syrk
    scores = np.empty(len(rows))
    chunk = max(1, BOUND_CHUNK_BYTES // (8 * n))
    for start in range(0, len(rows), chunk):
        these = rows[start:start + chunk]
        distances = squares[these, None] + squares[None, :] - 2.0 * cross[:, start:start + chunk].T
        np.maximum(distances, 0.0, out=distances)
        distances[np.arange(len(these)), these] = np.inf  # a row is not its own neighbour
        scores[start:start + chunk] = k_smallest_sums(distances, k)
    return scores


def _first_equal_rows(stack: UpdateStack, rows: np.ndarray) -> dict[int, int]:
    """Each of ``rows`` -> the first of them with equal values (as read): clones of one update,
    which Byzantine agents may send and the bench's fleet does, need one float64 score, not one each.

    Rows are grouped by their first block's bytes, and each group is confirmed equal over the
    other blocks in one vectorised comparison per block (memory speed; hashing whole rows took
    a third of a Krum round at 1,000 x 127k). Rows that differ from their group's first later on
    are grouped by a hash of all their values."""
    picked = [int(i) for i in rows]
    width = stack.block_width(len(picked))
    buffer = np.empty(width * len(picked), dtype=np.float32 if stack.exact_in_float32 else np.float64)
    blocks = stack.blocks(width)
    values = stack.read_rows(next(blocks), buffer, picked)
    by_prefix: dict[bytes, int] = {}
    leader = np.array([by_prefix.setdefault(values[p].tobytes(), p) for p in range(len(picked))])
    same = np.ones(len(picked), dtype=bool)
    for block in blocks:
        values = stack.read_rows(block, buffer, picked)
        same &= (values == values[leader]).all(axis=1)
    first = {picked[p]: picked[leader[p]] for p in np.flatnonzero(same)}
    differing = [picked[p] for p in np.flatnonzero(~same)]  # a leader always matches itself
    if differing:
        first.update(_first_equal_by_hash(stack, differing))
    return first


def _first_equal_by_hash(stack: UpdateStack, rows: list[int]) -> dict[int, int]:
    hashes = [hashlib.sha256() for _ in rows]
    width = stack.block_width(len(rows))
    buffer = np.empty(width * len(rows), dtype=np.float32 if stack.exact_in_float32 else np.float64)
    for block in stack.blocks(width):
        values = stack.read_rows(block, buffer, rows)
        for digest, row in zip(hashes, values, strict=True):
            digest.update(row.data)
    first: dict[bytes, int] = {}
    return {i: first.setdefault(digest.digest(), i) for i, digest in zip(rows, hashes, strict=True)}


def _from_exact(stack: UpdateStack, k: int, count: int) -> Selection:
    scores = exact_scores(stack, np.arange(stack.n), k)
    order = np.argsort(scores, kind="stable")
    return Selection(int(order[0]), np.sort(order[:count]))


def _float32_gram(stack: UpdateStack) -> tuple[np.ndarray, float, float]:
    """G~ (float64, n x n), its relative bound eps and the absolute one (see _score_bounds)."""
    n = stack.n
    gram = np.zeros((n, n))
    product = np.empty((n, n), dtype=np.float32)
    direct = stack.exact_in_float32  # then read as float32 and centred there: one rounding, no float64 copy
    buffer = np.empty(0 if direct else FLOAT32_BLOCK * n)
    low = np.empty(FLOAT32_BLOCK * n, dtype=np.float32)
    blocks = 0
    for block in stack.blocks(FLOAT32_BLOCK):
        if direct:
            rounded = stack.read_rows(block, low)
            rounded -= centre(rounded).astype(np.float32)  # x - c, both float32: rounded once
        else:
            values = stack.read_rows(block, buffer)
            rounded = low[:values.size].reshape(values.shape)
            np.subtract(values, centre(values), out=rounded, casting="same_kind")
        with np.errstate(over="ignore", invalid="ignore"):
            np.matmul(rounded, rounded.T, out=product)  # a @ a.T: BLAS syrk, half the products
        gram += product
        blocks += 1
    eps = 1.01 * ((FLOAT32_BLOCK + 2) * U32 + (blocks + 2) * U64) + FLOAT64_MARGIN
    # float32 subnormals: each rounding errs by up to 2^-150 absolutely, so a dot product of d
    # values by at most 2^-150 (sqrt(d) (|x_i| + |x_j|) + 3 d); kept generous (2^-140).
    return gram, eps, 2.0 ** -140


def _score_bounds(gram: np.ndarray, eps: float, tiny: float, k: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """[L_i, U_i] around each exact score, from G~ and its bound (see the module's docstring)."""
    n = len(gram)
    diagonal = gram.diagonal().copy()
    root_d = math.sqrt(max(width, 1))
    norms = np.sqrt((np.maximum(diagonal, 0.0) + tiny * 3 * width) / (1.0 - eps))
    norms += tiny * root_d  # |x_i| from G~_ii, rounded up past both bounds
    lower, upper = np.empty(n), np.empty(n)
    chunk = max(1, BOUND_CHUNK_BYTES // (8 * n))
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        distances = diagonal[start:stop, None] + diagonal[None, :] - 2.0 * gram[start:stop]
        spread = norms[start:stop, None] + norms[None, :]
        error = eps * spread * spread + 4.0 * tiny * (root_d * spread + 3 * width)
        own = (np.arange(stop - start), np.arange(start, stop))
        low = np.maximum(distances - error, 0.0)
        low[own] = np.inf
        lower[start:stop] = k_smallest_sums(low, k)
        np.maximum(distances, 0.0, out=distances)
        distances += error
        distances[own] = np.inf
        upper[start:stop] = k_smallest_sums(distances, k)
    return lower, upper
