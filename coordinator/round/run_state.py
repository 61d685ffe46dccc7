"""The one object the engine mutates: where the run is. Only ``coordinator.round`` writes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.aggregation.running_mean import RunningMean
from coordinator.round.norm_clip import NormGate, RoundNorms
from coordinator.state.rounds import OpenRound, RoundSummary

if TYPE_CHECKING:
    from coordinator.admission.intake import UpdateIn
    from protocol.messages import Update


@dataclass(frozen=True)
class HeldSums:
    """A site's partial sums, admitted and checked, not yet folded (``coordinator.round.sites``)."""

    site: str
    family: str
    round: int
    means: dict[str, RunningMean]
    """Payload field (``delta``, SCAFFOLD's ``control_delta``) -> the site's running mean."""
    members: frozenset[str]
    total_weight: float


@dataclass
class RunState:
    session: str
    """Random at every start, and again when the broker lost our persistent session: agents resend to a new one."""
    run_id: str = ""
    epoch: int = 0
    """The run's epoch (``coordinator.round.epochs``): in every message it signs, so agents can drop older runs'."""
    next_round: int = 1
    """Rounds below it are closed; it is the next to open."""
    finished: bool = False
    open: OpenRound | None = None
    closing: bool = False
    """A closed round is being aggregated and checkpointed in the background; none opens meanwhile."""
    last_summary: RoundSummary | None = None
    """The newest closed round."""
    connected: bool = False
    ever_connected: bool = False
    deferred: list[UpdateIn] = field(default_factory=list)
    """Asynchronous rounds: updates held for the next buffer (bounded by the engine)."""
    norm_gate: NormGate[tuple[Update, float]] = field(default_factory=lambda: NormGate(RoundNorms(0.0)))
    """The open round's deltas held until their family's median norm exists (reset when a round opens)."""
    site_gate: NormGate[HeldSums] = field(default_factory=lambda: NormGate(RoundNorms(0.0)))
    """Sites' partial sums while the root has no bound of its own (no direct delta yet): held until the round's
    sites' mean norms give a median, which then bounds each (reset when a round opens)."""
    pending_sums: list[HeldSums] = field(default_factory=list)
    """Sites' sums of a family whose own deltas the norm gate still holds for their cohort: placed at the close."""
    task_revision: int = -1
    """``TaskAgreement.revision`` when the run's card was last published."""
    last_wait_log: float = -1e9
    gauges_refreshed: float = -1e9

    @property
    def current_round(self) -> int:
        """The open round, else the last closed one (0 before the first)."""
        return self.open.number if self.open is not None else max(self.next_round - 1, 0)
