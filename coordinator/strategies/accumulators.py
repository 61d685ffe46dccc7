"""One round's payloads, taken in as they are accepted: folded (the mean) or stored as rows (robust rules).

Under the weighted mean, nothing needs an update's arrays after it is folded in, so a round
holds a few float64 sums per family instead of every update: memory is constant in the
number of agents. Each payload field is combined by a fixed rule, the same one the batch path
uses (see ``FOLD_RULES``), and updates fold together only when all their payload layouts agree
(a joint layout key), so that a bootstrap round can still drop the minority layout afterwards:
the kept group is always a union of whole folded groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.aggregation import AggregationError, FailureReason
from coordinator.aggregation.rows import RowMatrix
from coordinator.aggregation.running_mean import Layout, RunningMean, combine_means, layout_key
from protocol.messages import Update


@dataclass(frozen=True)
class FoldRule:
    by_samples: bool
    """Weight each update by its sample count (else every update counts once)."""
    clipped: bool
    """Subject to the aggregator's clip_norm (deltas); absolute values are never clipped."""


FOLD_RULES: dict[str, FoldRule] = {
    "weights": FoldRule(by_samples=True, clipped=False),
    "delta": FoldRule(by_samples=True, clipped=True),
    # SCAFFOLD's c averages the variates with the weights its delta uses: with uniform ones it is the
    # gradient of another objective, whose optimum x then settles at (tests/unit/test_scaffold_reference.py).
    "control_delta": FoldRule(by_samples=True, clipped=False),
}


@dataclass
class _Group:
    means: dict[str, RunningMean]
    members: set[str] = field(default_factory=set)


class RoundFolds:
    """The running means of one round, per (family, joint payload layout)."""

    def __init__(self, clip_norm: float | None) -> None:
        self.clip_norm = clip_norm
        self._groups: dict[tuple[str, tuple[tuple[str, Layout], ...]], _Group] = {}
        self._layouts: dict[str, dict[str, Layout]] = {}

    def add(self, update: Update, weight: float = 1.0, factors: Mapping[str, float] | None = None) -> Update:
        """Fold ``update``'s payload in (by-samples fields at ``weight`` x its samples, each field's arrays scaled
        by its entry in ``factors``, if any); return it without the folded arrays (so they can be freed)."""
        payload = {name: getattr(update, name) for name in FOLD_RULES if getattr(update, name)}
        joint = tuple((name, layout_key(arrays)) for name, arrays in payload.items())
        group = self._groups.get((update.family, joint))
        if group is None:
            group = _Group({name: RunningMean(self.clip_norm if FOLD_RULES[name].clipped else None)
                            for name in payload})
            self._groups[(update.family, joint)] = group
        for name, arrays in payload.items():
            share = float(update.num_samples) * weight if FOLD_RULES[name].by_samples else 1.0
            group.means[name].add(arrays, share, update.agent_id, (factors or {}).get(name, 1.0))
        group.members.add(update.agent_id)
        self._layouts[update.agent_id] = dict(joint)
        return update.model_copy(update={name: {} for name in payload})

    def add_folded(self, family: str, means: Mapping[str, RunningMean], members: set[str]) -> None:
        """Means folded elsewhere (a site's partial aggregate of ``members``, a secure round's unmasked sums),
        payload field -> mean, as a group of its own: ``mean`` combines each with the groups of the same
        layout, exactly as if its members had been folded here."""
        layouts: dict[str, Layout] = {}
        for name, mean in means.items():
            assert mean.layout is not None
            layouts[name] = mean.layout
        group = _Group(dict(means), set(members))
        joint = (*sorted(layouts.items()), ("members", tuple(sorted(members))))  # never an update's own key
        self._groups[(family, joint)] = group  # type: ignore[index]
        for agent_id in members:
            self._layouts[agent_id] = dict(layouts)

    def layout(self, update: Update, name: str) -> Layout | None:
        """The layout ``update`` had in payload field ``name`` when it was folded (None: it had none)."""
        return self._layouts.get(update.agent_id, {}).get(name)

    def mean(self, group: Sequence[Update], name: str) -> dict:
        """The mean of field ``name`` over exactly the updates in ``group`` (one family)."""
        ids = {u.agent_id for u in group}
        family = group[0].family
        parts = [g for (fam, _), g in self._groups.items() if fam == family and g.members & ids]
        if any(not g.members <= ids for g in parts) or sum(len(g.members) for g in parts) != len(ids):
            raise AggregationError(FailureReason.LAYOUT_MISMATCH, f"{name}: the group is not a union of folded groups")
        if any(name not in g.means for g in parts):
            raise AggregationError(FailureReason.LAYOUT_MISMATCH, f"some updates of {family} carry no {name}")
        return combine_means(g.means[name] for g in parts)


class RoundRows:
    """For robust rules: each payload field's floating values copied into a row matrix per
    (family, field, layout) on receipt, in memory within ``budget_bytes`` for the round, a
    memory-mapped file in ``spill_dir`` beyond it. The kept update carries views of its rows."""

    def __init__(self, capacity: int, budget_bytes: int, spill_dir: Path | None) -> None:
        self.capacity = capacity
        self.budget_bytes = budget_bytes
        self.spill_dir = spill_dir
        self._matrices: dict[tuple[str, str, Layout], RowMatrix] = {}

    def add(self, update: Update) -> Update:
        kept = {}
        for name in FOLD_RULES:
            arrays = getattr(update, name)
            if not arrays:
                continue
            key = (update.family, name, layout_key(arrays))
            matrix = self._matrices.get(key)
            if matrix is None:
                used = sum(m.matrix.nbytes for m in self._matrices.values() if not m.spilled)
                matrix = RowMatrix(arrays, self.capacity, budget_bytes=max(0, self.budget_bytes - used),
                                   spill_dir=self.spill_dir)
                self._matrices[key] = matrix
            kept[name] = matrix.append(arrays)
        return update.model_copy(update=kept)

    @property
    def stored(self) -> int:
        """Rows stored so far, over every matrix."""
        return sum(m.count for m in self._matrices.values())

    @property
    def spilled_bytes(self) -> int:
        return sum(m.matrix.nbytes for m in self._matrices.values() if m.spilled)

    def close(self) -> None:
        for matrix in self._matrices.values():
            matrix.close()
        self._matrices.clear()
