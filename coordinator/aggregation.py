"""Aggregation as pure numpy functions over named arrays, shared by every strategy.

Each function takes the clients' arrays (a sequence of ``{name: array}`` with identical
layouts) and per-client weights, and returns one ``{name: array}`` in the input dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

NamedArrays = Mapping[str, np.ndarray]


class AggregationError(ValueError):
    """The inputs cannot be aggregated as configured; the round fails with ``reason``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _check_inputs(updates: Sequence[NamedArrays], weights: Sequence[float]) -> np.ndarray:
    if not updates:
        raise AggregationError("no_updates", "nothing to aggregate")
    if len(weights) != len(updates):
        raise AggregationError("bad_weights", f"{len(weights)} weights for {len(updates)} updates")
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise AggregationError("bad_weights", "weights must be finite, non-negative, and not all zero")
    first = updates[0]
    for update in updates[1:]:
        if update.keys() != first.keys() or any(update[k].shape != first[k].shape for k in first):
            raise AggregationError("layout_mismatch", "updates do not share one layout")
    return w


def weighted_mean(updates: Sequence[NamedArrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """sum_i w_i x_i / sum_i w_i for every floating array, accumulated in float64.

    Integer arrays (counters such as BatchNorm's ``num_batches_tracked``) are not averaged:
    an average of counts is not a count. They are taken from the update with the largest
    weight (the first of equals), a value some client really holds.
    """
    w = _check_inputs(updates, weights)
    total = w.sum()
    heaviest = int(np.argmax(w))
    out: dict[str, np.ndarray] = {}
    for name, reference in updates[0].items():
        if reference.dtype.kind not in "fc":
            out[name] = np.array(updates[heaviest][name], copy=True)
            continue
        acc = np.zeros(reference.shape, dtype=np.float64)
        scratch = np.empty(reference.shape, dtype=np.float64)
        for update, weight in zip(updates, w, strict=True):
            if weight == 0.0:
                continue
            np.multiply(update[name], weight / total, out=scratch, dtype=np.float64)
            acc += scratch
        out[name] = acc.astype(reference.dtype, copy=False)
    return out
