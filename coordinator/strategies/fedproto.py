"""FedProto (Tan et al., 2022): agents with different models share class prototypes only.

An agent's prototype of class ``c`` is the mean embedding of its training samples of ``c``;
it sends one ``[classes, dim]`` float32 array with the count behind each row, never weights.
Every model family embeds into the same dimension, so one set of global prototypes serves
them all. It is published under each known family's own topic (``global/{family}/{round}``,
identical payloads apart from the family name, one digest), so agents subscribe to their
family's topic as under FedAvg and a family that never trained still gets the prototypes.

Server side, per round: the count-weighted per-class mean of the agents' prototypes (through
the configured aggregator), optionally L2-normalised, then mixed with the previous global
prototypes by ``momentum``. A class nobody reported this round keeps its previous prototype.
The alignment weight ``lambda`` is announced each round, ramped up over ``warmup_rounds``.
Under secure aggregation the coordinator never sees one agent's prototypes: it gets each family's per-class
sums of count-weighted prototypes and counts (``accumulate_prototype_sums``) and divides their totals.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.admission.decisions import Reject
from coordinator.aggregation import AggregationError
from coordinator.aggregation.aggregator import AggregateFn, Aggregator, build_aggregator
from coordinator.reasons import RejectReason
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.base import Dropped, FamilyState, Strategy, check_base, majority_by
from protocol.messages import Update

log = logging.getLogger(__name__)

PROTOTYPE_DTYPE = np.dtype("<f4")
DRIFT_FACTOR = 3.0
"""An agent whose prototypes lie this many times the round's median distance from the global
ones is logged as drifting (a broken sensor, a poisoned data set, a bug in its build)."""


def aggregate_prototypes(aggregator: AggregateFn, prototypes: Sequence[np.ndarray],
                         counts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per class, the count-weighted mean of the prototypes of the agents that hold the class.

    Weighted by counts because an agent's prototype of class ``c`` is the mean of its ``n_ic``
    embeddings of ``c``: weighting each by ``n_ic`` makes the global prototype the mean of every
    embedding of ``c`` in the federation, exactly what pooling the samples would give. An agent
    with 3 samples of a class then moves it as much as 3 samples should, not as much as one
    with 300. Agents without the class (count 0) take no part in its row; a class no agent holds
    gets a zero row and count 0. Each class is one call of ``aggregator`` over
    ``[{"proto": row}, ...]`` with the counts as weights, so robust aggregators apply per class;
    prototypes are absolute values, so strategies pass the rule without clipping.

    Returns (prototypes [classes, dim] float32, counts [classes] int64 summed over agents).
    """
    if not prototypes or len(prototypes) != len(counts):
        raise ValueError(f"{len(prototypes)} prototype arrays for {len(counts)} count arrays")
    classes, dim = prototypes[0].shape
    merged = np.zeros((classes, dim), dtype=PROTOTYPE_DTYPE)
    totals = np.zeros(classes, dtype=np.int64)
    for c in range(classes):
        holders = [i for i, n in enumerate(counts) if n[c] > 0]
        if not holders:
            continue
        mean = aggregator([{"proto": prototypes[i][c]} for i in holders], [float(counts[i][c]) for i in holders])
        merged[c] = mean["proto"]
        totals[c] = min(sum(int(counts[i][c]) for i in holders), np.iinfo(np.int64).max)  # admission bounds them
    return merged, totals


def prototype_sums(prototypes: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per class, the float64 sum of count x prototype and the int64 total count: the mean's numerator and
    denominator, which a site sends up and the root adds over sites and its own agents (``merge_prototype_sums``)."""
    if not prototypes or len(prototypes) != len(counts):
        raise ValueError(f"{len(prototypes)} prototype arrays for {len(counts)} count arrays")
    sums = np.zeros(prototypes[0].shape, np.float64)
    totals = np.zeros(prototypes[0].shape[0], np.int64)
    for rows, n in zip(prototypes, counts, strict=True):
        sums += rows.astype(np.float64) * n.astype(np.float64)[:, None]
        totals += n.astype(np.int64)
    return sums, totals


def group_sums(rule: AggregateFn | None, prototypes: Sequence[np.ndarray],
               counts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A group's (sums, counts) for ``merge_prototype_sums``: exact under the mean (``rule`` None), else the rule's
    per-class result x the class's count. AggregationError when too few hold a class for the rule."""
    if rule is None:
        return prototype_sums(prototypes, counts)
    merged, totals = aggregate_prototypes(rule, prototypes, counts)
    return merged.astype(np.float64) * totals[:, None], totals


def capped_counts(counts: np.ndarray, samples: int, claimed: int) -> np.ndarray:
    """Per-class counts of an update that claimed ``claimed`` samples and counts for ``samples``: scaled down alike."""
    if claimed <= 0 or samples >= claimed:
        return counts
    return np.floor(counts * (samples / claimed)).astype(counts.dtype)


def prototypes_problem(update: Update, shape: tuple[int, ...] | None) -> Reject | None:
    """Why ``update``'s prototypes cannot count (missing, not float32, not ``shape``, counts past its samples), or
    None. The counts weigh each class's prototype: tied to the sample count, which admission caps (a count past it
    would let one device own a class, and a huge one overflowed the merge's int64 totals)."""
    if update.prototypes is None or update.prototype_counts is None:
        return Reject(RejectReason.MISSING_PAYLOAD, "a fedproto update carries prototypes and counts")
    if update.prototypes.dtype != PROTOTYPE_DTYPE:
        return Reject(RejectReason.BAD_SHAPE, f"prototypes must be float32, got {update.prototypes.dtype}")
    if shape is not None and update.prototypes.shape != shape:
        return Reject(RejectReason.BAD_SHAPE, f"prototypes are {list(update.prototypes.shape)}, expected {list(shape)}")
    counted = sum(int(c) for c in update.prototype_counts.reshape(-1))
    if counted > update.num_samples:
        return Reject(RejectReason.BAD_COUNTS, f"prototype_counts sum to {counted}, more than the "
                                               f"{update.num_samples} samples claimed")
    return None


def merge_prototype_sums(families: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per class, the count-weighted mean over groups of sums (``sum_i n_ic p_ic``, ``sum_i n_ic`` per group: a secure
    round's unmasked sums per family, within the grid's step, or the sites' and the root's own agents' in a plain
    round): the plain rule's result where every agent's claim was capped alike. Counts round to whole samples; a
    class whose count rounds to 0 gets a zero row and count 0 as in plain rounds."""
    sums = np.sum([s for s, _ in families], axis=0)
    totals = np.sum([c for _, c in families], axis=0)
    counts = np.rint(np.maximum(totals, 0.0)).astype(np.int64)
    merged = np.zeros_like(sums)
    held = counts > 0
    merged[held] = sums[held] / totals[held, None]
    return merged.astype(PROTOTYPE_DTYPE), counts


def normalize_rows(prototypes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Rows with a count scaled to unit L2 norm (a zero row stays zero)."""
    out = prototypes.astype(np.float64)
    norms = np.linalg.norm(out, axis=1)
    scale = (counts > 0) & (norms > 0)
    out[scale] /= norms[scale, None]
    return out.astype(PROTOTYPE_DTYPE)


class FedProto(Strategy):
    algorithm = "fedproto"
    folds_payloads = False  # prototypes are small, and weighted per class by counts

    def __init__(self, aggregator: Aggregator | AggregateFn, lam: float, *, warmup_rounds: int = 0, momentum: float = 0.0,
                 normalize: bool = False) -> None:
        super().__init__(aggregator)
        if lam < 0 or warmup_rounds < 0 or not 0.0 <= momentum < 1.0:
            raise ValueError(f"fedproto needs lambda >= 0, warmup_rounds >= 0 and momentum in [0, 1), "
                             f"got {lam}, {warmup_rounds}, {momentum}")
        self.lam = lam
        self.warmup_rounds = warmup_rounds
        self.momentum = momentum
        self.normalize = normalize
        self.prototypes: np.ndarray | None = None
        self.counts: np.ndarray | None = None
        self.secure_sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """This round's unmasked (prototype sums, counts) per family, in count units (a secure round)."""
        self.site_sums: list[tuple[np.ndarray, np.ndarray]] = []
        """This round's sites' (prototype sums, counts), beside the prototypes of the agents that answered here."""

    def scheduled_lambda(self, round_number: int) -> float:
        """``lambda * min(1, (round - 1) / warmup_rounds)``: zero in round 1 (no global prototypes
        exist yet), the full weight from round ``warmup_rounds + 1``; constant without warm-up."""
        if self.warmup_rounds == 0:
            return self.lam
        return self.lam * min(1.0, max(round_number - 1, 0) / self.warmup_rounds)

    def round_params(self, round_number: int) -> dict[str, float | int | bool]:
        return {"lambda": self.scheduled_lambda(round_number), "normalize": self.normalize}

    def check_update(self, update: Update) -> Reject | None:
        stale = check_base(update, self.states.get(update.family))
        if stale is not None:
            return stale
        return prototypes_problem(update, self.prototypes.shape if self.prototypes is not None else None)

    def begin_round(self, capacity: int, *, memory_budget_bytes: int = 512 * 1024**2,
                    spill_dir: Path | None = None, voters: Mapping[str, Collection[str]] | None = None) -> None:
        super().begin_round(capacity, memory_budget_bytes=memory_budget_bytes, spill_dir=spill_dir, voters=voters)
        self.secure_sums = {}
        self.site_sums = []

    def accumulate_prototype_sums(self, family: str, sums: np.ndarray, counts: np.ndarray, members: set[str]) -> bool:
        if self.prototypes is not None and sums.shape != self.prototypes.shape:
            raise ValueError(f"{family}'s unmasked prototype sums are {list(sums.shape)}, the global prototypes "
                             f"{list(self.prototypes.shape)}")
        self.secure_sums[family] = (sums, counts)
        return True

    def accumulate_site_prototypes(self, sums: np.ndarray, counts: np.ndarray) -> bool:
        if self.prototypes is not None and sums.shape != self.prototypes.shape:
            return False
        self.site_sums.append((sums, counts))
        return True

    def aggregate(self, round_number: int, updates: Sequence[Update],
                  population: Mapping[str, int] | None = None) -> list[Dropped]:
        # arrival order must not matter; agents a site counted stand in without prototypes (its sums hold theirs)
        group = sorted((u for u in updates if u.prototypes is not None), key=lambda u: u.agent_id)
        dropped: list[Dropped] = []
        if self.secure_sums:
            fresh, fresh_counts = merge_prototype_sums(list(self.secure_sums.values()))
        else:
            if self.prototypes is None and group:
                group, dropped = majority_by(group, lambda u: u.prototypes.shape, "prototypes")  # type: ignore[union-attr]
            (fresh, fresh_counts), too_few = self._merge(group)
            dropped += too_few
        if self.normalize:
            fresh = normalize_rows(fresh, fresh_counts)
        self.prototypes, self.counts = self._mix(fresh, fresh_counts)
        families = set(self.states) | {u.family for u in updates} | set(population or {})
        self._publish_for(families, round_number + 1)
        report_drift(round_number, updates)
        return dropped

    def _merge(self, group: Sequence[Update]) -> tuple[tuple[np.ndarray, np.ndarray], list[Dropped]]:
        """The round's prototypes and counts: the rule over the agents that answered here; with sites, that group's
        sums (exact under the mean) added to the sites' and divided once: the count-weighted mean across groups,
        which for the mean equals the flat rule over every agent. Beside sites, a group here too small for a robust
        rule is dropped (the sites' sums still count), as a site drops its own."""
        prototypes = [u.prototypes for u in group]
        counts = [u.prototype_counts for u in group]
        if not self.site_sums:
            return aggregate_prototypes(self.aggregator.unclipped, prototypes, counts), []  # type: ignore[arg-type]
        groups, dropped = list(self.site_sums), []
        rule = self.aggregator.unclipped if self.aggregator.needs_individual_updates else None
        if group:
            try:
                groups.append(group_sums(rule, prototypes, counts))  # type: ignore[arg-type]
            except AggregationError as exc:
                dropped = [Dropped(u.agent_id, RejectReason.SITE_TOO_FEW, f"the agents here, beside sites: {exc}")
                           for u in group]
        # Sites' sums are shaped as the task's prototypes (round/sites.py); the agents here as their majority, which
        # agrees with the task unless the agents' models disagree with the task card: then the sites' are left out.
        shape = groups[-1][0].shape
        kept = [g for g in groups if g[0].shape == shape]
        if len(kept) < len(groups):
            log.warning("%d site prototype sums are not shaped %s like the agents' here: left out",
                        len(groups) - len(kept), list(shape))
        return merge_prototype_sums(kept), dropped

    def _mix(self, fresh: np.ndarray, fresh_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Server momentum: ``m * old + (1 - m) * fresh`` where both exist; otherwise whichever does."""
        if self.prototypes is None or self.counts is None:
            return fresh, fresh_counts
        old, old_counts = self.prototypes.astype(np.float64), self.counts
        mixed = np.where((fresh_counts > 0)[:, None], fresh.astype(np.float64), old)
        both = (fresh_counts > 0) & (old_counts > 0)
        mixed[both] = self.momentum * old[both] + (1.0 - self.momentum) * fresh[both].astype(np.float64)
        counts = np.where(fresh_counts > 0, fresh_counts, old_counts).astype(np.int64)
        prototypes = mixed.astype(PROTOTYPE_DTYPE)
        return (normalize_rows(prototypes, counts) if self.normalize else prototypes), counts

    def _publish_for(self, families: set[str], round_number: int) -> None:
        assert self.prototypes is not None and self.counts is not None
        self.states = {f: FamilyState(round=round_number, weights={}, prototypes=self.prototypes,
                                      prototype_counts=self.counts) for f in sorted(families)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "prototypes": self.prototypes, "prototype_counts": self.counts}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        super().load_state_dict(data)
        prototypes, counts = data.get("prototypes"), data.get("prototype_counts")
        if prototypes is None or counts is None:
            if self.states:
                raise ValueError("fedproto checkpoint has family states but no global prototypes")
            return
        prototypes, counts = np.array(prototypes), np.array(counts)
        if prototypes.ndim != 2 or prototypes.dtype != PROTOTYPE_DTYPE or counts.shape != prototypes.shape[:1]:
            raise ValueError(f"fedproto checkpoint holds prototypes {prototypes.dtype}{list(prototypes.shape)} "
                             f"with counts {list(counts.shape)}")
        for family, state in self.states.items():
            if state.prototypes is None or not np.array_equal(state.prototypes, prototypes):
                raise ValueError(f"fedproto checkpoint: family {family} does not hold the global prototypes")
        self.prototypes, self.counts = prototypes, counts.astype(np.int64)


def report_drift(round_number: int, updates: Sequence[Update]) -> list[str]:
    """Log the spread of the agents' reported ``proto_distance``; returns the agents flagged as drifting."""
    distances = {u.agent_id: u.metrics.extra["proto_distance"] for u in updates if "proto_distance" in u.metrics.extra}
    if len(distances) < 2:
        return []
    median = statistics.median(distances.values())
    farthest = max(distances, key=lambda agent: distances[agent])
    log.info("round %d: distance of agents' prototypes to the global ones: median %.3f, max %.3f (%s)",
             round_number, median, distances[farthest], farthest)
    drifting = sorted(a for a, d in distances.items() if median > 0 and d > DRIFT_FACTOR * median)
    if drifting:
        log.warning("round %d: prototypes of %s lie over %.0fx the median distance (%.3f) from the global ones",
                    round_number, ", ".join(drifting), DRIFT_FACTOR, median)
    return drifting


def build(settings: CoordinatorSettings) -> FedProto:
    """The ``fedproto`` entry of ``coordinator/strategies/registry.py``."""
    return FedProto(build_aggregator(settings), settings.proto_lambda, warmup_rounds=settings.proto_warmup_rounds,
                    momentum=settings.proto_momentum, normalize=settings.proto_normalize)
