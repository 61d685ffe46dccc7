"""The records of one round: while it is open, and once it is closed."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from protocol.messages import RoundAnnouncement, Update


@dataclass
class OpenRound:
    announcement: RoundAnnouncement
    payload: bytes
    """The announcement as published, republished unchanged after a reconnect or restart."""
    deadline: float
    """Coordinator monotonic clock."""
    opened: float
    wanted: int
    """Updates that close the round before its deadline (fewer than selected when over-selecting)."""
    updates: dict[str, Update] = field(default_factory=dict)
    went_offline: set[str] = field(default_factory=set)
    """Selected agents seen going offline while the round was open: dropouts unless they answered."""
    bytes_in: int = 0
    bytes_out: int = 0
    rejected: int = 0
    publish_s: float = 0.0
    median_claim: float | None = None
    """The median sample count the selected agents reported when it opened: what weight caps scale with."""
    clipped_claims: list[str] = field(default_factory=list)
    """Agents whose update claimed more samples than it may count for (counted for the cap)."""
    clipped_norms: list[str] = field(default_factory=list)
    """Agents whose delta was clipped to the round's median-based bound."""
    partials: set[tuple[str, str]] = field(default_factory=set)
    """(site, family) of every site's partial aggregate taken in (coordinator/round/sites.py)."""
    folded_sites: set[tuple[str, str]] = field(default_factory=set)
    """(site, family) whose secure partial's unmasked sum was folded (``coordinator/round/secure_sites.py``)."""
    decoded_sites: set[tuple[str, str]] = field(default_factory=set)
    """(site, family) whose unmasked sum the root read, folded or refused after: a release distributed DP charges."""
    settled: set[str] = field(default_factory=set)
    """Agents a site reported as rejected or straggling: they cannot answer this round any more."""
    site_stragglers: set[str] = field(default_factory=set)
    sites: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per site: its agents accepted, rejected and straggling, and the update bytes it took in."""
    secure_done: bool = False
    """Secure aggregation (``coordinator/round/secure.py``): the sum is unmasked, or the round failed; it closes."""
    ending: tuple[str, str] | None = None
    """(outcome, reason) a round closes with whatever answered (a secure round under its threshold)."""
    secure: dict[str, Any] | None = None
    """Secure aggregation's account of the round, for ``rounds.jsonl``: stages, dropouts, whose masks were recovered."""

    @property
    def number(self) -> int:
        return self.announcement.round

    @property
    def selected(self) -> list[str]:
        return self.announcement.selected

    @functools.cached_property
    def selected_set(self) -> frozenset[str]:
        """For membership tests: one per inbound message, over up to 10,000 names."""
        return frozenset(self.announcement.selected)

    def enough_answered(self) -> bool:
        answered = len(self.updates)
        return answered >= min(self.wanted, len(self.selected)) or (
            bool(self.settled) and answered + len(self.settled) >= len(self.selected))

    def quorum(self, fraction: float, minimum: int) -> int:
        """Updates needed to aggregate at the deadline: a fraction of those wanted, not of those selected."""
        wanted = min(self.wanted, len(self.selected))
        return min(wanted, max(minimum, math.ceil(fraction * wanted)))


@dataclass
class FamilySummary:
    answered: int
    accuracy: float | None
    loss: float | None


@dataclass
class RoundSummary:
    round: int
    task: str
    outcome: str
    """completed | quorum_missed | failed | interrupted"""
    reason: str | None
    selected: int
    answered: int
    stragglers: int
    dropouts: int
    rejected: int
    quorum: int
    duration_s: float
    deadline_s: float
    bytes_in: int
    bytes_out: int
    accuracy: float | None
    """Of the global model the round started from, on the answering agents' held-out data."""
    loss: float | None
    train_loss: float | None
    closed_at: float
    accuracy_median: float | None = None
    """The median of the answering agents' accuracies (``accuracy`` is their bounded-weight mean)."""
    accuracy_min: float | None = None
    accuracy_max: float | None = None
    """The spread across agents: one agent's claim shows here, not in the median."""
    families: dict[str, FamilySummary] = field(default_factory=dict)
    surplus: int = 0
    """Over-selected agents still working when the round closed early (neither stragglers nor dropouts)."""
    epsilon_max: float | None = None
    """Largest DP epsilon any agent had reported by the round's close; None without DP."""
    budget_exhausted: int = 0
    """Agents whose DP budget was spent by the round's close."""
    detail: str | None = None
    """What exactly went wrong, for a round that did not complete (``reason`` is the bounded code)."""
    publish_s: float | None = None
    """Seconds spent publishing the round's global states and announcement when it opened."""
    collect_s: float | None = None
    """Seconds from opening until it closed (enough answers, or the deadline)."""
    aggregate_s: float | None = None
    checkpoint_s: float | None = None
    """Both off the message loop; ``duration_s`` is publish + collect + aggregate + checkpoint."""
    clipped_claims: list[str] = field(default_factory=list)
    """Agents whose claimed sample count was cut to the bound (``Accept.samples``)."""
    clipped_norms: list[str] = field(default_factory=list)
    """Agents whose delta was clipped to ``max_norm_ratio`` x the round's median norm."""
    sites: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per site aggregator that sent a partial: its agents accepted, rejected, straggling, and update bytes."""
    secure: dict[str, Any] | None = None
    """A securely aggregated round: per family its survivors, the agents whose masks were recovered (self-masks
    of survivors that did not answer the unmasking, pairwise masks of dropped agents), per stage durations,
    dropouts and bytes."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoundSummary:
        families = {k: FamilySummary(**v) for k, v in data.get("families", {}).items()}
        return cls(**{**data, "families": families})
