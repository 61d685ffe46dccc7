"""The weighted mean: FedAvg's rule, and the last step of Multi-Krum."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from coordinator.aggregation.stack import NamedArrays, UpdateStack

MEAN_BLOCK_BYTES = 3 * 1024 * 1024
"""Small enough that one block stays in cache between the copy and the product, and under
OpenBLAS's size for threading a matrix-vector product (which only costs here)."""


def weighted_mean(updates: Sequence[NamedArrays], weights: Sequence[float], *,
                  clip_norm: float | None = None) -> dict[str, np.ndarray]:
    """sum_i w_i x_i / sum_i w_i for every floating array, accumulated in float64.

    Integer arrays (counters such as BatchNorm's ``num_batches_tracked``) are not averaged:
    an average of counts is not a count. They are taken from the update with the largest
    weight (the first of equals), a value some client really holds.

    With ``clip_norm``, each update is first scaled to an L2 norm of at most ``clip_norm``
    (over all its floating values); integer arrays are not scaled.
    """
    stack = UpdateStack(updates, weights, clip_norm=clip_norm)
    merged = mean_of_rows(stack, stack.weights, divisor=float(stack.weights.sum()))
    merged.update(stack.others_from(int(np.argmax(stack.weights))))
    return stack.in_order(merged)


def mean_of_rows(stack: UpdateStack, coefficients: np.ndarray, rows: Sequence[int] | None = None, *,
                 divisor: float = 1.0) -> dict[str, np.ndarray]:
    """sum_r coefficients[r] * row r / divisor (over ``rows``, default all) for the floating arrays.

    Dividing once at the end, rather than scaling each coefficient, keeps sums of integers
    exact and saves a rounding per term.

    Block by block: the rows' values are copied into one float64 (rows, width) buffer and
    multiplied by the coefficient vector, so memory does not grow with the number of rows.
    """
    rows = range(stack.n) if rows is None else rows
    outputs, flat_outputs = stack.new_outputs()
    width = stack.block_width(len(rows), MEAN_BLOCK_BYTES)
    buffer = np.empty(width * len(rows))
    result = np.empty(width)
    for block in stack.blocks(width):
        values = stack.read_rows(block, buffer, rows)
        np.dot(coefficients, values, out=result[:block.width])
        result[:block.width] /= divisor
        stack.write(flat_outputs, block, result)
    return outputs
