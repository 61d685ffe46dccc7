"""What the loop decided about a round as it closed, completed by the background job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.aggregation import AggregationError
from coordinator.state.rounds import OpenRound, RoundSummary
from coordinator.strategies.base import Dropped


@dataclass
class Closure:
    """What the loop decided about a round as it closed; the rest is done in the background."""

    open_round: OpenRound
    outcome: str
    """completed (if aggregation succeeds) | quorum_missed | interrupted"""
    reason: str | None
    stragglers: set[str]
    dropouts: set[str]
    surplus: set[str]
    quorum: int
    population: Mapping[str, int]
    epsilon_max: float | None
    budget_exhausted: int
    next_round: int
    finished: bool
    closed_at: float
    """Wall clock."""
    collect_s: float
    detail: str | None = None
    dropped: list[Dropped] = field(default_factory=list)
    failure: AggregationError | None = None
    aggregate_s: float = 0.0
    checkpoint_s: float = 0.0
    checkpoint_bytes: int = 0
    spilled_bytes: int = 0
    """Bytes of updates a robust rule kept in a memory-mapped file (past the memory budget)."""
    summary: RoundSummary | None = None
    loop_state: dict[str, Any] = field(default_factory=dict)
    """What the checkpoint keeps of state the loop goes on changing (``closing.loop_state``), taken on the loop."""
    checkpoint: dict[str, Any] | None = None
    """The run's checkpoint after this round: written by the driver (state file ``checkpoint``), off the
    loop, before the engine applies the closure."""
