"""Bounded influence by size: each delta is clipped to a multiple of its round's median norm (engine side).

The reference is a robust statistic of the *current* round (the median of the norms of the
family's deltas accepted so far), so a minority of agents cannot move it, and it is never carried
over from an earlier round: when an attacker pushes the model, the honest agents' corrective
deltas grow with it, and a reference that followed them would ratchet up. An update is clipped,
never rejected, for its size: an honest agent whose delta grew because the model was pushed still
counts, at most ``ratio`` times the median.

The median needs a few values to mean anything: the first deltas of a family in a round are held
and folded once the family's cohort (its agents selected for the round) arrived, or at most
``HOLD_MAX`` of them or a memory budget's worth, but at least ``HOLD``; or when the round closes.
Later deltas are clipped as they arrive against the median of all the family's norms so far (a
running median: two heaps, O(log n) per delta). Holding a small round's whole cohort makes every
delta's bound the median of the whole round whatever order the updates came in: with only the
first ``HOLD`` held, the bound depended on which agents answered first, and the same run trained
another model each time it ran. Past ``HOLD_MAX`` norms, which ones came first barely moves it. Of an even count
the lower middle value is taken: with two deltas, the larger (perhaps an attacker's) sets nothing.
A round that closes with fewer than ``HOLD`` deltas of a family clips them against the lower of its
own median and the last median that did rest on ``HOLD`` or more: one attacker alone in a round
would otherwise be clipped against its own norm. That only ever lowers the bound, so it cannot
ratchet up. A family with no such median yet (its first trained rounds, or under FedBuff, whose
buffers mix families, every buffer with fewer than ``HOLD`` of its deltas) is clipped against the
round's other families (``fallback``): their median *relative* step (each delta's norm over its family's
weights' norm, ``scales``) times its own weights' norm, scale-free across model sizes; for weights that
are all zero (nothing to be relative to), their median step per parameter (norm over the square root of
its parameter count, ``sizes``) times its own count's root. SCAFFOLD's control deltas likewise, against
the other families' control deltas and each family's server variate. A lone attacker would otherwise
move a small family by any amount, up to the float32 limit, where every later round fails. The price: an
honest family whose weights start far smaller than its steps (relative to the others') is held back in
its first rounds, until a round with ``HOLD`` of its deltas gives it a median of its own.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from coordinator.aggregation.running_mean import l2_norm
from coordinator.settings import MEDIAN_OF
from protocol.messages import Update

T = TypeVar("T")

HOLD = MEDIAN_OF
"""Deltas of a family held before its round's median is trusted (the median of 3 ignores one outlier)."""

HOLD_MAX = 32
"""The most deltas of a family held for its cohort's median (holding more would delay folding in large rounds)."""


class RunningMedian:
    """The median of the values added so far, in O(log n) per value."""

    def __init__(self) -> None:
        self._low: list[float] = []  # max-heap (negated): the lower half
        self._high: list[float] = []  # min-heap: the upper half

    def add(self, value: float) -> None:
        if self._low and value > -self._low[0]:
            heapq.heappush(self._high, value)
        else:
            heapq.heappush(self._low, -value)
        if len(self._low) > len(self._high) + 1:
            heapq.heappush(self._high, -heapq.heappop(self._low))
        elif len(self._high) > len(self._low):
            heapq.heappush(self._low, -heapq.heappop(self._high))

    def __len__(self) -> int:
        return len(self._low) + len(self._high)

    def median(self) -> float:
        """The middle value; of an even count, the lower of the two middle ones."""
        if not self:
            raise ValueError("no values")
        return -self._low[0]


class RoundNorms:
    """One round's norms per family, and the bound each delta is clipped to. Owned by the engine."""

    def __init__(self, ratio: float, trusted: Mapping[str, float] | None = None,
                 scales: Mapping[str, float] | None = None, sizes: Mapping[str, int] | None = None) -> None:
        """``trusted``: per key (a family, or ``control_key`` of one), the last median that rested on at least ``HOLD``
        norms (``carried``); ``scales``: per key, the L2 norm of the family's weights (of its server control variate)
        as the round opened; ``sizes``: per key, how many floating values those have."""
        self.ratio = ratio
        self._medians: dict[str, RunningMedian] = {}
        self.trusted = dict(trusted or {})
        self.scales = {k: s for k, s in (scales or {}).items() if s >= 0 and math.isfinite(s)}
        self.sizes = {k: n for k, n in (sizes or {}).items() if n > 0}
        # Per kind (deltas, control deltas), every family's together: norm / its scale, and norm / sqrt(its size).
        self._relative = {kind: RunningMedian() for kind in ("delta", "control")}
        self._per_value = {kind: RunningMedian() for kind in ("delta", "control")}

    def observe(self, family: str, norm: float) -> None:
        self._medians.setdefault(family, RunningMedian()).add(norm)
        if not math.isfinite(norm):
            return
        kind = _kind(family)
        if self.scales.get(family, 0.0) > 0:
            self._relative[kind].add(norm / self.scales[family])
        if family in self.sizes:
            self._per_value[kind].add(norm / math.sqrt(self.sizes[family]))

    def ready(self, family: str) -> bool:
        """Whether deltas of ``family`` may be clipped and folded now (enough norms for a median)."""
        return self.ratio <= 0 or len(self._medians.get(family, ())) >= HOLD

    def bound(self, family: str) -> float | None:
        """``ratio`` x the median of the family's norms so far; None when clipping is off or nothing arrived."""
        median = self._medians.get(family)
        if self.ratio <= 0 or median is None or not median:
            return None
        value = median.median()
        if len(median) < HOLD and family in self.trusted:
            value = min(value, self.trusted[family])
        elif len(median) < HOLD and (reference := self.fallback(family)) is not None:
            value = min(value, reference)
        return self.ratio * value

    def fallback(self, family: str) -> float | None:
        """What the round's deltas of every family (of its kind) say one of ``family``'s may be, before ``ratio``:
        their median relative step times its scale, or where its scale is 0 their median step per value times the
        root of its size; None without ``HOLD`` of them (or nothing known of the family)."""
        kind, scale = _kind(family), self.scales.get(family)
        if scale is not None and scale > 0:
            relative = self._relative[kind]
            return relative.median() * scale if len(relative) >= HOLD else None
        per_value = self._per_value[kind]
        if scale is None or family not in self.sizes or len(per_value) < HOLD:
            return None
        return per_value.median() * math.sqrt(self.sizes[family])

    def carried(self) -> dict[str, float]:
        """What the next round's norms trust: each family's median of this round where it rested on ``HOLD`` or
        more norms, else the one this round trusted."""
        return {**self.trusted, **{family: median.median() for family, median in self._medians.items()
                                   if len(median) >= HOLD}}


CONTROL_SUFFIX = "/control"


def _kind(key: str) -> str:
    """Which of RoundNorms' cross-family medians a key's norms go to: deltas', or SCAFFOLD control deltas'."""
    return "control" if key.endswith(CONTROL_SUFFIX) else "delta"


def control_key(family: str) -> str:
    """The norms' key for a family's SCAFFOLD control deltas: the server's variate moves by their mean, so one
    device's must not be unbounded (it would steer every agent's correction)."""
    return f"{family}{CONTROL_SUFFIX}"


def norm_scales(weights: Mapping[str, Mapping[str, np.ndarray]], controls: Mapping[str, Mapping[str, np.ndarray]]
                ) -> tuple[dict[str, float], dict[str, int]]:
    """Per family (and ``control_key`` of one with a server control variate): the L2 norm and the number of floating
    values of its weights (its variate), what a lone delta is measured against (``RoundNorms.fallback``)."""
    scales: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for key, arrays in [*weights.items(), *((control_key(f), c) for f, c in controls.items())]:
        if arrays:
            scales[key] = l2_norm(arrays)
            sizes[key] = sum(a.size for a in arrays.values() if a.dtype.kind == "f")
    return scales, sizes


def held_size(update: Update) -> int:
    """What holding ``update`` for the round's median costs: its decoded arrays (a compressed upload unpacks)."""
    return sum(a.nbytes for part in (update.delta, update.control_delta) for a in part.values())


def clip_factor(norm: float, bound: float | None) -> float:
    """What a delta of L2 norm ``norm`` is scaled by to be at most ``bound``: 1 when it is within (or unbounded)."""
    if bound is None or norm <= bound or not math.isfinite(norm) or norm == 0:
        return 1.0
    return bound / norm


def clipped(delta: Mapping[str, np.ndarray], norm: float, bound: float | None) -> tuple[dict[str, np.ndarray], bool]:
    """``delta`` scaled to at most ``bound`` (float arrays only; integer buffers are not averaged anyway)."""
    factor = clip_factor(norm, bound)
    return scaled(delta, factor), factor != 1.0


def scaled(arrays: Mapping[str, np.ndarray], factor: float) -> dict[str, np.ndarray]:
    """A copy of ``arrays`` with the floating ones times ``factor`` in their own dtype (the others as they are)."""
    if factor == 1.0:
        return dict(arrays)
    return {name: (a * np.asarray(factor, a.dtype) if a.dtype.kind == "f" else a) for name, a in arrays.items()}


@dataclass
class NormGate(Generic[T]):
    """One round's clipping: the norms seen per family, and the accepted updates held until a median exists."""

    norms: RoundNorms
    cohorts: Mapping[str, int] = field(default_factory=dict)
    """Per family, the round's selected agents: their deltas are held (up to ``HOLD_MAX``) until all came."""
    hold_bytes: int = 0
    """Past this many bytes of held deltas (every family's together), the gate stops waiting for cohorts."""
    others: int = 0
    """Selected agents whose family is not known (statuses not heard yet after a restart): counted in every
    family's cohort, since holding too many only waits for the close, and too few makes the bound order-dependent."""
    held: dict[str, list[tuple[T, float]]] = field(default_factory=dict)
    _held_bytes: dict[str, int] = field(default_factory=dict)
    _released: set[str] = field(default_factory=set)

    def admit(self, family: str, item: T, norm: float, size: int = 0) -> list[tuple[T, float | None]]:
        """Note ``item``'s norm (``size``: its bytes); what may be folded now, each with the bound to clip it to."""
        self.norms.observe(family, norm)
        if not self.norms.ready(family) or (family in self.held and self._waits_for_cohort(family, size)):
            self.held.setdefault(family, []).append((item, norm))
            self._held_bytes[family] = self._held_bytes.get(family, 0) + size
            return []
        self._held_bytes.pop(family, None)
        self._released.add(family)
        bound = self.norms.bound(family)
        return [(held, bound) for held, _ in self.held.pop(family, [])] + [(item, bound)]

    def waiting(self, family: str) -> bool:
        """Whether the family's bound may still move with deltas held or to come for its cohort (sums a site folded
        wait for it too: ``round/sites.py``)."""
        if self.norms.ratio <= 0:
            return False
        return family in self.held or (family not in self._released and self.cohorts.get(family, 0) + self.others > 0)

    def _waits_for_cohort(self, family: str, size: int) -> bool:
        seen = len(self.held[family]) + 1
        return (seen < min(self.cohorts.get(family, 0) + self.others, HOLD_MAX)
                and sum(self._held_bytes.values()) + size <= self.hold_bytes)

    def release(self) -> list[tuple[T, float | None]]:
        """The round closes: everything still held, against the median of what arrived."""
        out = [(item, self.norms.bound(family)) for family, items in self.held.items() for item, _ in items]
        self._released.update(self.held)
        self.held.clear()
        self._held_bytes.clear()
        return out
