"""The engine's collaborators, built once from the settings: who is out there, what was agreed, how to publish.

Opening, closing, resuming and applying are modules of functions over ``EngineParts`` and the one
``RunState``; ``RoundEngine`` routes its inputs to them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from coordinator.admission.intake import Intake
from coordinator.admission.rosters import RosterOrder
from coordinator.admission.task_agreement import TaskAgreement
from coordinator.fleet.agents import AgentRegistry
from coordinator.fleet.enrollment import Enrollment
from coordinator.fleet.notices import DuplicateWatch, NoticeLimiter
from coordinator.fleet.privacy import FleetPrivacy
from coordinator.policies import RoundPolicy, build_policy
from coordinator.round.actions import Actions
from coordinator.round.publishing import Publisher
from coordinator.settings import CoordinatorSettings
from coordinator.state.applied import AppliedVersions
from coordinator.state.central_privacy import CentralPrivacyLedger
from coordinator.state.retained import RetainedStates
from coordinator.state.versions import VersionLog
from coordinator.strategies.base import Strategy
from coordinator.telemetry.heterogeneity import HeterogeneityMetrics, LabelSkew
from coordinator.telemetry.metrics import CoordinatorMetrics
from coordinator.telemetry.rejects import RejectLog
from protocol.compression import CompressionSpec
from protocol.security.signing import SigningKey
from protocol.security.trust import OPEN, Trust
from protocol.topics import Topics

if TYPE_CHECKING:
    from coordinator.fleet.agents import AgentRecord
    from coordinator.round.run_state import RunState
    from protocol.messages import RoundAnnouncement

log = logging.getLogger(__name__)


class SecureStages(Protocol):
    """What the engine, opening a round and routing messages, asks of secure aggregation's driver."""

    ledger: CentralPrivacyLedger | None
    """Distributed DP's spending, checkpointed with the run (None: no noise)."""

    def plan(self, parts: EngineParts, announcement: RoundAnnouncement,
             records: dict[str, AgentRecord]) -> RoundAnnouncement: ...

    def begin(self, parts: EngineParts, run: RunState) -> None: ...

    def receive(self, parts: EngineParts, run: RunState, topic: str, payload: bytes) -> None: ...

    def advance(self, parts: EngineParts, run: RunState, now: float) -> None: ...


STATE_LOG_INTERVAL_S = 60.0
"""An agent's state changes are logged at most once in this many seconds (the metrics count every one)."""


@dataclass
class EngineParts:
    settings: CoordinatorSettings
    strategy: Strategy
    policy: RoundPolicy
    metrics: CoordinatorMetrics
    clock: Callable[[], float]
    """Monotonic: deadlines and timeouts."""
    wall_clock: Callable[[], float]
    """Wall time: announcements' issue time, summaries."""
    topics: Topics
    registry: AgentRegistry
    enrollment: Enrollment | None
    task: TaskAgreement
    versions: VersionLog
    applied: AppliedVersions
    """Per agent, the newest version whose update was applied (an update counts at most once)."""
    labels: LabelSkew
    """Agents' label counts: the federation's label distribution, KL weighting and skew metrics."""
    heterogeneity: HeterogeneityMetrics
    privacy: FleetPrivacy
    retained: RetainedStates
    actions: Actions
    publisher: Publisher
    rejects: RejectLog
    intake: Intake
    notices: NoticeLimiter
    """Which refusals earn their agent a notice, and how often."""
    duplicates: DuplicateWatch
    rosters: RosterOrder = field(default_factory=RosterOrder)
    """Per site, the newest roster taken and the last resync request (``coordinator/round/rosters.py``)."""
    state_log: NoticeLimiter = field(default_factory=lambda: NoticeLimiter(STATE_LOG_INTERVAL_S))
    """How often an agent's change of state is logged: a flapping sender must not flood the log."""
    secure: SecureStages | None = None
    """Secure aggregation's stages (``coordinator/round/secure.py``, set by the engine), with ``secure_aggregation`` on."""

    @property
    def central_ledger(self) -> CentralPrivacyLedger | None:
        return self.secure.ledger if self.secure is not None else None

    @classmethod
    def build(cls, settings: CoordinatorSettings, strategy: Strategy, metrics: CoordinatorMetrics, *,
              clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
              signing_key: SigningKey | None = None) -> EngineParts:
        enrollment = Enrollment(settings.enrollment_path, clock) if settings.enrollment == "required" else None
        if enrollment is None:
            log.warning("enrollment is open: any client that reaches the broker can join and send updates "
                        "(for experiments only; enroll agents with 'coordinator enroll' and drop --enrollment open)")
        task = TaskAgreement(settings.task_card())
        topics = Topics(settings.federation)
        actions, retained, rejects = Actions(), RetainedStates(), RejectLog(metrics)
        trust = OPEN if enrollment is None else Trust(enrollment.lookup, required=True)
        return cls(
            settings=settings, strategy=strategy, policy=build_policy(settings), metrics=metrics, clock=clock,
            wall_clock=wall_clock, topics=topics,
            registry=AgentRegistry(settings.agent_timeout_s, settings.max_known_agents), enrollment=enrollment,
            task=task, versions=VersionLog(settings.max_staleness), applied=AppliedVersions(),
            labels=LabelSkew(task.card.num_classes or None),
            heterogeneity=HeterogeneityMetrics(metrics.registry, device_label=metrics.device_label),
            privacy=FleetPrivacy(metrics), retained=retained, actions=actions,
            publisher=Publisher(actions, metrics, topics, retained, signing_key, settings.max_message_bytes),
            rejects=rejects, notices=NoticeLimiter(settings.notice_interval_s), duplicates=DuplicateWatch(),
            intake=Intake(topics, metrics, trust, CompressionSpec.parse(settings.compression),
                          settings.max_update_bytes, task.card.num_classes, rejects),
        )
