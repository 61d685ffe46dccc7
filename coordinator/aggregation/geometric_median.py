"""The geometric median by smoothed Weiszfeld iterations: RFA (Pillutla, Kakade, Harchaoui, 2022).

The geometric median of updates w_1..w_n minimises sum_i a_i ||z - w_i|| (whole-update L2
norms, every floating array concatenated, as Krum's distances). It has a breakdown point of
1/2: fewer than half the updates cannot carry it arbitrarily far, unlike the mean, and unlike
the coordinate-wise median it is one point of the updates' span, not a patchwork of coordinates.

Smoothed Weiszfeld, starting from the mean (RFA's Algorithm 2):

    beta_i = a_i / max(nu, ||w_i - z||),    z <- sum_i beta_i w_i / sum_i beta_i

The smoothing nu keeps an update at (or within nu of) z from dividing by zero. It stops after
``iterations`` updates of z, or as soon as one lowers the objective sum_i a_i ||z - w_i|| by no
more than ``tolerance`` times its new value (RFA's relative tolerance).

a_i = 1 for every update of positive weight: like the other robust rules here, sample counts
are not used, because agents report their own and a Byzantine agent could claim any weight
(RFA weights by sample counts; its threat model trusts them).

Streaming: z is never stored whole in float64. One pass over the rows' column blocks computes a
block of the next iterate from the current coefficients (z's block = coefficients @ rows) and
each row's squared distance to it, accumulated in float64; so an iteration costs one read of
the rows (memory-mapped spill files included) and working memory stays one block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from coordinator.aggregation.errors import AggregationError, FailureReason
from coordinator.aggregation.mean import MEAN_BLOCK_BYTES
from coordinator.aggregation.stack import NamedArrays, UpdateStack, check_f

DEFAULT_ITERATIONS = 10
DEFAULT_SMOOTHING = 1e-6
"""RFA's (and its TensorFlow Federated implementation's) default nu."""
DEFAULT_TOLERANCE = 1e-6
"""The settings' defaults too (geomed_iterations, geomed_smoothing, geomed_tolerance; a test keeps them equal)."""


def geometric_median(updates: Sequence[NamedArrays], weights: Sequence[float], *, f: int = 0,
                     iterations: int = DEFAULT_ITERATIONS, smoothing: float = DEFAULT_SMOOTHING,
                     tolerance: float = DEFAULT_TOLERANCE, clip_norm: float | None = None) -> dict[str, np.ndarray]:
    """The approximate geometric median of the updates (of positive weight), each counted once.

    ``f`` is the number of Byzantine updates to tolerate: like the median, it needs a strict
    honest majority, n > 2f, else fails with ``too_few_updates``. Integer arrays: the
    coordinate-wise lower median. With ``clip_norm``, updates are first scaled to that L2 norm at most.
    """
    check_f(f)
    check_parameters(iterations, smoothing, tolerance)
    stack = UpdateStack(updates, weights, clip_norm=clip_norm)
    if stack.n <= 2 * f:
        raise AggregationError(FailureReason.TOO_FEW_UPDATES, f"the geometric median tolerates f={f} Byzantine "
                                                              f"updates only with n > {2 * f}, got n={stack.n}")
    merged, _ = smoothed_weiszfeld(stack, iterations, smoothing, tolerance)
    merged.update(stack.others_lower_median())
    return stack.in_order(merged)


def check_parameters(iterations: int, smoothing: float, tolerance: float) -> None:
    if iterations < 1:
        raise AggregationError(FailureReason.INVALID_PARAMETER, f"geometric median needs iterations >= 1, got {iterations}")
    if not (math.isfinite(smoothing) and smoothing > 0):
        raise AggregationError(FailureReason.INVALID_PARAMETER, f"geometric median needs smoothing > 0, got {smoothing}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise AggregationError(FailureReason.INVALID_PARAMETER, f"geometric median needs tolerance >= 0, got {tolerance}")


def smoothed_weiszfeld(stack: UpdateStack, iterations: int, smoothing: float,
                       tolerance: float) -> tuple[dict[str, np.ndarray], int]:
    """The floating arrays of the last iterate (in the inputs' dtypes), and how many iterations ran.

    Every row counts once (a_i = 1). Each pass writes its iterate into the outputs, so the last
    pass leaves the result there.
    """
    outputs, flat_outputs = stack.new_outputs()
    distances = _iterate(stack, np.ones(stack.n), flat_outputs)  # z_0: the plain mean
    objective = math.fsum(distances)
    done = 0
    while done < iterations:
        distances = _iterate(stack, 1.0 / np.maximum(distances, smoothing), flat_outputs)
        done += 1
        previous, objective = objective, math.fsum(distances)
        if abs(previous - objective) <= tolerance * objective:
            break
    return outputs, done


def _iterate(stack: UpdateStack, betas: np.ndarray, flat_outputs: list[np.ndarray]) -> np.ndarray:
    """Write z = sum_i betas_i row_i / sum_i betas_i into the outputs; return each row's L2 distance to z.

    The distances are to z in float64, before it is rounded to the outputs' dtype.
    """
    # A block small enough to stay in cache across the product, the subtraction and the sum of squares.
    width = stack.block_width(budget=min(stack.block_bytes, MEAN_BLOCK_BYTES))
    buffer = np.empty(width * stack.n)
    z = np.empty(width)
    divisor = float(betas.sum())
    squares = np.zeros(stack.n)
    for block in stack.blocks(width):
        rows = stack.read_rows(block, buffer)
        np.dot(betas, rows, out=z[:block.width])
        z[:block.width] /= divisor  # divided once at the end, as in mean_of_rows
        stack.write(flat_outputs, block, z)
        rows -= z[:block.width]
        squares += np.einsum("ij,ij->i", rows, rows)
    return np.sqrt(squares)
