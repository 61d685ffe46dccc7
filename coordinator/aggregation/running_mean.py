"""The weighted mean, folded in one update at a time: memory grows with the model, not the fleet.

``RunningMean`` keeps sum_i w_i x_i in float64 for every floating array, sum_i w_i, and the
integer arrays of the heaviest update so far; an update's arrays can be let go as soon as it
is folded in. ``result`` equals :func:`coordinator.aggregation.weighted_mean` over the same
updates up to float64 rounding: the sums are taken in arrival order rather than in one dot
product, a difference of about 1e-16 relative that the final rounding to float32 absorbs in
all but rare last bits. Integer arrays come from the update of the largest weight, ties to
the smallest key (agent id), as the batch rule's first-of-equals in agent-id order.

With ``clip_norm``, each update is scaled to at most that L2 norm (over its floating values,
in float64) before it is added, as in the batch rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from coordinator.aggregation.errors import AggregationError, FailureReason
from coordinator.aggregation.stack import NamedArrays, check_clip_norm

Layout = tuple[tuple[str, tuple[int, ...], str], ...]


def layout_key(arrays: NamedArrays) -> Layout:
    """Names, shapes and dtypes, hashable: updates fold together only when these agree."""
    return tuple((name, tuple(a.shape), a.dtype.str) for name, a in arrays.items())


NORM_BLOCK = 8192
"""Values widened to float64 at a time for the norm: the block stays in cache, BLAS sums it."""


class NormedArrays(dict[str, np.ndarray]):
    """Named arrays that carry their L2 norm, taken once on receipt (off the loop, see admission/intake.py):
    admission, the norm gate's clipping and a clipped fold all read it instead of passing over the values again.
    Read-only, so the norm cannot go stale; anything that changes the arrays builds a plain dict."""

    def __init__(self, arrays: NamedArrays, norm: float) -> None:
        super().__init__(arrays)
        self.norm = norm

    def __reduce__(self) -> tuple[type[NormedArrays], tuple[dict[str, np.ndarray], float]]:
        return NormedArrays, (dict(self), self.norm)  # copies and pickles rebuild it whole

    def _read_only(self, *args: object, **kwargs: object) -> None:
        raise TypeError("NormedArrays are read-only: build a new dict to change them")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _read_only  # type: ignore[assignment]


def with_norm(arrays: NamedArrays) -> NormedArrays:
    """``arrays`` with their L2 norm attached (computed here unless they carry it already)."""
    return arrays if isinstance(arrays, NormedArrays) else NormedArrays(arrays, l2_norm(arrays))


def l2_norm(arrays: NamedArrays) -> float:
    """L2 norm over every floating value, accumulated in float64 (the norm ``arrays`` carry, if they do)."""
    if isinstance(arrays, NormedArrays):
        return arrays.norm
    total = 0.0
    scratch: np.ndarray | None = None
    for array in arrays.values():
        if array.dtype.kind != "f":
            continue
        flat = array.reshape(-1)
        if flat.dtype == np.float64:
            with np.errstate(over="ignore"):  # finite values near the limit: an infinite norm, which admission refuses
                total += float(np.dot(flat, flat))
            continue
        if scratch is None:  # per call, not shared: workers take norms concurrently
            scratch = np.empty(min(NORM_BLOCK, max(a.size for a in arrays.values())), np.float64)
        for start in range(0, flat.size, NORM_BLOCK):  # widened block by block: no model-sized temporary
            block = scratch[:min(NORM_BLOCK, flat.size - start)]
            np.copyto(block, flat[start:start + NORM_BLOCK])
            total += float(np.dot(block, block))
    return math.sqrt(total)


class RunningMean:
    """One layout's running weighted sum; see the module docstring."""

    def __init__(self, clip_norm: float | None = None) -> None:
        check_clip_norm(clip_norm)
        self.clip_norm = clip_norm
        self.layout: Layout | None = None
        self.sums: dict[str, np.ndarray] = {}
        self.total_weight = 0.0
        self.count = 0
        """Updates folded in with a positive weight."""
        self._others: dict[str, np.ndarray] = {}
        self._heaviest: tuple[float, str] | None = None

    def add(self, arrays: NamedArrays, weight: float, key: str, factor: float = 1.0) -> None:
        """Fold ``arrays`` in with ``weight``; ``key`` (the sender) breaks ties between equal weights.

        ``factor``: fold them as if scaled by it (a norm clip's, ``clip_factor``), without a scaled copy; the weight
        is not scaled."""
        if not (math.isfinite(weight) and weight >= 0):
            raise AggregationError(FailureReason.BAD_WEIGHTS, f"weight {weight} of {key}")
        if not (math.isfinite(factor) and 0 <= factor <= 1):  # 0: a bound of 0 (a median of zero deltas)
            raise AggregationError(FailureReason.BAD_WEIGHTS, f"scale factor {factor} of {key}")
        layout = layout_key(arrays)
        if self.layout is None:
            self.layout = layout
            self.sums = {n: np.zeros(a.shape, np.float64) for n, a in arrays.items() if a.dtype.kind == "f"}
        elif layout != self.layout:
            raise AggregationError(FailureReason.LAYOUT_MISMATCH, f"{key}'s arrays differ from the first update's")
        if any(a.dtype.kind == "c" for a in arrays.values()):
            raise AggregationError(FailureReason.UNSUPPORTED_DTYPE, f"{key} sent complex arrays")
        if weight == 0:
            return  # contributes nothing, as in the batch rule
        scale = factor
        if self.clip_norm is not None:
            norm = l2_norm(arrays) * factor
            scale *= min(1.0, self.clip_norm / norm) if norm > 0 else 1.0
        coefficient = weight * scale
        for name, total in self.sums.items():
            total += np.multiply(arrays[name], coefficient, dtype=np.float64)
        self.total_weight += weight
        self.count += 1
        rank = (weight, key)
        if self._heaviest is None or weight > self._heaviest[0] or (weight == self._heaviest[0] and key < self._heaviest[1]):
            self._heaviest = rank
            self._others = {n: np.array(a, copy=True) for n, a in arrays.items() if a.dtype.kind != "f"}

    @property
    def heaviest(self) -> tuple[float, str] | None:
        """(weight, key) of the heaviest update folded in, whose integer arrays ``others`` holds."""
        return self._heaviest

    @property
    def others(self) -> NamedArrays:
        return self._others

    @classmethod
    def of_sums(cls, layout: Layout, sums: NamedArrays, others: NamedArrays, total_weight: float, count: int,
                heaviest: tuple[float, str]) -> RunningMean:
        """A running mean folded elsewhere (a site aggregator's partial aggregate), to combine with this one's.

        ``layout`` is the folded arrays' (names, shapes, dtypes); ``sums`` its floating arrays' weighted sums in
        float64, ``others`` its integer arrays, taken from ``heaviest`` (weight, key)."""
        floating = {name for name, _, dtype in layout if np.dtype(dtype).kind == "f"}
        if sums.keys() != floating or others.keys() != {name for name, _, _ in layout} - floating:
            raise AggregationError(FailureReason.LAYOUT_MISMATCH, "the sums do not cover the layout's arrays")
        if not (math.isfinite(total_weight) and total_weight > 0 and count > 0):
            raise AggregationError(FailureReason.BAD_WEIGHTS, f"total weight {total_weight} of {count}")
        mean = cls()
        mean.layout, mean.total_weight, mean.count, mean._heaviest = layout, total_weight, count, heaviest
        mean.sums = {name: np.array(a, dtype=np.float64, copy=True) for name, a in sums.items()}
        mean._others = {name: np.array(a, copy=True) for name, a in others.items()}
        return mean

    def result(self) -> dict[str, np.ndarray]:
        """The weighted mean, in the inputs' names, shapes and dtypes (floats rounded once)."""
        return combine_means([self])


def combine_means(parts: Iterable[RunningMean]) -> dict[str, np.ndarray]:
    """The weighted mean over several running means of one layout, as if folded into one."""
    parts = [p for p in parts if p.count]
    if not parts:
        raise AggregationError(FailureReason.NO_UPDATES, "nothing to aggregate (or every weight was zero)")
    layout = parts[0].layout
    assert layout is not None
    if any(p.layout != layout for p in parts):
        raise AggregationError(FailureReason.LAYOUT_MISMATCH, "folded groups do not share one layout")
    total = sum(p.total_weight for p in parts)
    if not (math.isfinite(total) and total > 0):
        raise AggregationError(FailureReason.BAD_WEIGHTS, "weights must be finite and not all zero")
    heaviest = min(parts, key=lambda p: (-p._heaviest[0], p._heaviest[1]))  # type: ignore[index]
    out: dict[str, np.ndarray] = {}
    for name, _, dtype in layout:
        if name in parts[0].sums:
            summed = parts[0].sums[name] if len(parts) == 1 else sum(p.sums[name] for p in parts)
            with np.errstate(over="ignore"):  # an overflow to inf fails the round where states are checked
                out[name] = np.asarray(summed / total).astype(np.dtype(dtype))
        else:
            out[name] = heaviest._others[name]
    return out

