"""Bounded influence by size: a delta far larger than the federation's recent ones is rejected.

An update's L2 norm is checked on receipt against ``ratio`` times the median norm of the
deltas accepted in the previous completed round of its family: one agent cannot drag the
model with a huge (finite) update, whatever the aggregator. The first delta round of a family
has no reference and is not checked (robust rules or --clip-norm cover it). Medians need at
least three updates to mean anything; with fewer the reference stays as it was.
"""

from __future__ import annotations

import statistics

from coordinator.admission.decisions import Reject
from coordinator.aggregation.running_mean import l2_norm
from coordinator.aggregation.stack import NamedArrays
from coordinator.reasons import RejectReason

MIN_FOR_MEDIAN = 3


class NormGuard:
    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self.reference: dict[str, float] = {}
        self._round: dict[str, list[float]] = {}

    def check(self, family: str, delta: NamedArrays) -> float | Reject:
        """The delta's norm, or a ``norm_outlier`` reject past ratio x the family's reference. Reads only."""
        norm = l2_norm(delta)
        reference = self.reference.get(family)
        if self.ratio > 0 and reference is not None and norm > self.ratio * reference:
            return Reject(RejectReason.NORM_OUTLIER,
                          f"delta norm {norm:.4g} is over {self.ratio:g} x the last round's median {reference:.4g}")
        return norm

    # The engine's side: what was accepted, and the round's end.
    def accepted(self, family: str, norm: float) -> None:
        self._round.setdefault(family, []).append(norm)

    def close_round(self, completed: bool) -> None:
        """A completed round's medians become the reference for the next."""
        if completed:
            for family, norms in self._round.items():
                if len(norms) >= MIN_FOR_MEDIAN and statistics.median(norms) > 0:
                    self.reference[family] = statistics.median(norms)
        self._round.clear()
