"""Coordinate-wise rules: the median and the trimmed mean (Yin et al., 2018), per coordinate.

Sample weights are not used by either, beyond leaving out updates of weight zero: they are
reported by the agents themselves, and a Byzantine agent claiming a million samples must not
carry the median with it. Each update counts once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from coordinator.aggregation.errors import AggregationError, FailureReason
from coordinator.aggregation.stack import NamedArrays, UpdateStack, check_f


def coordinate_median(updates: Sequence[NamedArrays], weights: Sequence[float], *, f: int = 0,
                      clip_norm: float | None = None) -> dict[str, np.ndarray]:
    """The median of each coordinate over the updates (of positive weight).

    With an even count, the mean of the two middle values. ``f`` is the number of Byzantine
    updates to tolerate: the median needs a strict honest majority, n > 2f, and fails with
    ``too_few_updates`` otherwise. Integer arrays: the coordinate-wise lower median. With
    ``clip_norm``, updates are first scaled to that L2 norm at most.
    """
    check_f(f)
    stack = UpdateStack(updates, weights, clip_norm=clip_norm)
    n = stack.n
    if n <= 2 * f:
        raise AggregationError(FailureReason.TOO_FEW_UPDATES,
                               f"the median tolerates f={f} Byzantine updates only with n > {2 * f}, got n={n}")
    lower, upper = (n - 1) // 2, n // 2
    return _per_coordinate(stack, lambda sorted_: 0.5 * (sorted_[:, lower] + sorted_[:, upper]))


def trimmed_mean(updates: Sequence[NamedArrays], weights: Sequence[float], *, beta: float, f: int = 0,
                 clip_norm: float | None = None) -> dict[str, np.ndarray]:
    """Per coordinate, drop the k = floor(beta * n) smallest and k largest values; average the rest.

    Needs 0 <= beta < 1/2 (so at least one value remains). ``f`` is the number of Byzantine
    updates to tolerate: each end must trim at least f values (k >= f), else the round fails
    with ``too_few_updates`` rather than silently averaging attackers in. Integer arrays: the
    coordinate-wise lower median. With ``clip_norm``, updates are first scaled to that L2 norm.
    """
    check_f(f)
    if not (0.0 <= beta < 0.5):
        raise AggregationError(FailureReason.INVALID_PARAMETER, f"trimmed mean needs 0 <= beta < 1/2, got {beta}")
    stack = UpdateStack(updates, weights, clip_norm=clip_norm)
    n = stack.n
    k = math.floor(beta * n)
    if k < f:
        raise AggregationError(FailureReason.TOO_FEW_UPDATES,
                               f"trimming {k} of n={n} at each end (beta={beta}) cannot exclude f={f} Byzantine "
                               f"updates; needs n >= {math.ceil(f / beta) if beta > 0 else 'inf'}")
    kept = n - 2 * k
    return _per_coordinate(stack, lambda sorted_: sorted_[:, k:n - k].sum(axis=1) / kept)


def _per_coordinate(stack: UpdateStack, reduce_sorted: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
    """Apply ``reduce_sorted`` to each block laid out one coordinate per row, sorted along the row.

    Sorting short rows (n values) is vectorised in numpy and beats selecting with
    ``np.partition`` on them; the transposed layout keeps each coordinate's n values adjacent.
    """
    outputs, flat_outputs = stack.new_outputs()
    buffer = np.empty(stack.block_width() * stack.n)
    for block in stack.blocks():
        columns = stack.read_columns(block, buffer)
        columns.sort(axis=1)
        stack.write(flat_outputs, block, reduce_sorted(columns))
    merged: dict[str, np.ndarray] = dict(outputs)
    merged.update(stack.others_lower_median())
    return stack.in_order(merged)
