"""One SecAgg+ session of a secure round at the root (``coordinator/round/secure.py``), and the stages' clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from protocol.messages import TrainMetrics
from protocol.secagg.server import SecAggServer
from protocol.secagg.wire import SecureFamily

STAGES = ("advertise", "share", "mask", "unmask")


@dataclass
class Session:
    """One family's SecAgg+ session in the open round (under FedProto, one across every family)."""

    family: str  # the family's name, or under FedProto the families' joined (secure_plan.shared_session)
    setup: SecureFamily
    server: SecAggServer
    like: dict[str, np.ndarray]
    """The family's global weights: the layout the sum is read back into."""
    control_like: dict[str, np.ndarray] | None = None
    """SCAFFOLD: the family's server control variate, the layout of the control deltas' sum (None: not masked)."""
    prototypes: tuple[int, int] | None = None
    """FedProto: (classes, dim) of the prototypes whose per-class sums and counts are masked instead of a delta."""
    members: dict[str, set[str]] = field(default_factory=lambda: {s: set() for s in STAGES})  # per stage (U1..U4)
    metrics: dict[str, TrainMetrics] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)  # each agent's, as it advertised: it counts for that one
    relays: tuple[str, ...] = ()
    """The families whose relay topics carry this session's keys and unmasking request."""


@dataclass
class StageClock:
    stage: str = "idle"
    opened: float = 0.0
    deadline: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    bytes_in: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STAGES})
    bytes_out: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STAGES})
