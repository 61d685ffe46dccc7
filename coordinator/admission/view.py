"""The read-only view admission decides on, and the shapes of what it reads.

The engine builds a view per message from its run state (cheap: references, no copies); admission
reads it and returns a decision. Collaborators are typed by the small protocols below, so
admission imports nothing above its floor (not the engine, not the strategies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from coordinator.admission.decisions import Decision, Reject
from coordinator.admission.task_agreement import TaskAgreement
from coordinator.state.rounds import OpenRound
from coordinator.state.versions import VersionLog
from protocol.messages import AgentStatus, Update
from protocol.topics import ParsedTopic


class PayloadChecks(Protocol):
    """The algorithm's checks of a training payload (the strategy implements them)."""

    def check_update(self, update: Update) -> Reject | None:
        """Against the family's current global state: its base, its payload's kind and layout."""

    def check_delta(self, update: Update) -> Reject | None:
        """The payload's layout only (a stale update's base is checked against its own version)."""


class EnrolledCaps(Protocol):
    def max_samples_of(self, agent_id: str) -> int | None:
        """The most samples the enrollment lets this agent claim; None: no cap of its own."""

    def get(self, agent_id: str) -> object | None:
        """The agent's enrollment; None when it is not enrolled."""


class LabelWeights(Protocol):
    def weight_factor(self, agent_id: str, temperature: float) -> float: ...

    def label_problem(self, status: AgentStatus) -> str | None: ...


class AppliedView(Protocol):
    def newest(self, agent_id: str) -> int | None:
        """The newest version whose update of this agent was applied; None: none yet."""


class AgentsView(Protocol):
    def family_of(self, agent_id: str) -> str | None:
        """The family its last status named; None: never heard of it."""

    def spent(self, agent_id: str) -> bool:
        """Whether its DP budget is spent: it is not selected to train."""

    def refusal(self, agent_id: str, now: float) -> str | None:
        """Why a status of this agent cannot be recorded now (the registry is full of live agents), or None."""

    def stale(self, status: AgentStatus) -> str | None:
        """Why ``status`` is older than the newest one heard from its agent (a replay), or None."""


@dataclass(frozen=True)
class AdmissionView:
    run_id: str
    next_round: int
    """The next round to open: rounds below it are closed."""
    open_round: OpenRound | None
    """Read, never written, by admission."""
    closing: bool
    """A round is being aggregated in the background; none is open until it is applied."""
    now: float
    agents: AgentsView
    task: TaskAgreement
    payloads: PayloadChecks
    versions: VersionLog
    applied: AppliedView
    labels: LabelWeights
    enrolled: EnrolledCaps | None
    """None: enrollment is open (no per-agent caps)."""
    max_samples: int
    """The most samples any update may count for (an enrollment's max_samples replaces it for that agent)."""
    claim_cap_multiple: float
    """Without an enrolled cap, an update counts for at most this times the round's median claim (0: no cap)."""
    weighting: Literal["samples", "kl"]
    kl_temperature: float

    def sample_cap(self, agent_id: str) -> int:
        """The most samples (weight) an update of this agent counts for: a bound the device cannot set.

        The operator's enrolled ``max_samples`` where given; otherwise a multiple of the median sample
        count the round's selected agents reported when it opened (one device cannot move a median),
        and never more than ``max_samples`` nor the ``claim_cap`` the round announced (a site's agents:
        the root's median is over every selected agent, the site's over its own)."""
        own = self.enrolled.max_samples_of(agent_id) if self.enrolled is not None else None
        if own:
            return min(self.max_samples, own)
        cap = self.max_samples
        median = self.open_round.median_claim if self.open_round is not None else None
        if median is not None and self.claim_cap_multiple > 0:
            cap = median_cap(median, self.claim_cap_multiple, self.max_samples)
        announced = self.open_round.announcement.claim_cap if self.open_round is not None else None
        return cap if announced is None else min(cap, announced)


def median_cap(median: float, multiple: float, max_samples: int) -> int:
    """``multiple`` x the median claim, rounded up, between 1 and ``max_samples``."""
    return min(max_samples, max(1, math.ceil(multiple * median)))


class UpdatePolicy(Protocol):
    """A round policy's part of admission (``coordinator.policies`` implement it)."""

    def decide(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Decision: ...

