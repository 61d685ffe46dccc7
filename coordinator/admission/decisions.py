"""What admission decides, as values: the engine applies them, admission never changes anything.

An update is accepted (with the weight it carries and how stale it is), rejected (a bounded
reason and a detail for the log) or deferred (asynchronous rounds: offer it again to the next
buffer). A status becomes events: forget the agent, observe it (perhaps with remarks that are
counted but drop nothing), or reject it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.reasons import RejectReason
from protocol.errors import Reason
from protocol.messages import AgentStatus


@dataclass(frozen=True)
class Accept:
    weight: float = 1.0
    """Multiplies the update's sample count in every by-samples mean (staleness, label skew)."""
    staleness: int = 0
    """Global versions published since the update's base (0 in synchronous rounds)."""
    norm: float | None = None
    """The L2 norm of its delta (the engine clips it against the round's median)."""
    samples: int | None = None
    """Set when the update claimed more samples than it may count for: the number it counts for."""


@dataclass(frozen=True)
class Reject:
    reason: RejectReason | Reason
    """Bounded: a label of ``fl_messages_rejected_total``."""
    detail: str
    """What exactly, for the log."""


@dataclass(frozen=True)
class Defer:
    detail: str


Decision = Accept | Reject | Defer


@dataclass(frozen=True)
class Forget:
    """A cleared retained status: the agent was decommissioned."""

    agent_id: str


@dataclass(frozen=True)
class Remark:
    """Counted and logged once like a reject, but the status is still observed (``action`` says what happened)."""

    reject: Reject
    action: str


@dataclass(frozen=True)
class Observe:
    status: AgentStatus
    """As it will be recorded: label counts the run cannot use already removed."""
    remarks: tuple[Remark, ...] = field(default_factory=tuple)


StatusDecision = Forget | Observe | Reject
