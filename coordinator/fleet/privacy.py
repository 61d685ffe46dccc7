"""The fleet's privacy spending as agents report it, in their updates and in their statuses.

Statuses count too: an agent whose budget is spent sends no more updates, but its retained
status still carries what it spent. Per agent the largest epsilon ever reported is kept, so
the exported figures never go down while the coordinator runs (unless an agent is removed).

An agent's ledger only grows. One that reports less than it did (a restored backup of its state
directory, a wiped one under a fixed id) would train again on data whose budget is spent: the
engine then stops selecting it to train until it reports at least as much again.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import PrivacySpent

ROLLBACK_TOLERANCE = 1.0 - 1e-6
"""A report this far under the highest (relatively) is a ledger that went back, not float noise."""


@dataclass(frozen=True)
class AgentPrivacy:
    device: str
    """Metric label of the agent's device class."""
    epsilon: float
    delta: float
    exhausted: bool


class FleetPrivacy:
    """O(1) per report (a fleet reports every heartbeat); only a decommissioned agent recounts."""

    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics
        self._agents: dict[str, AgentPrivacy] = {}
        self._device_max: dict[str, float] = {}
        self._device_exhausted: dict[str, int] = {}
        self._max: float | None = None

    def observe(self, agent_id: str, device: str, spent: PrivacySpent | None) -> float | None:
        """Take an agent's report; the highest epsilon it reported before when this one is lower (its ledger went
        back), else None."""
        if spent is None:
            return None
        previous = self._agents.get(agent_id)
        behind = previous.epsilon if previous is not None and spent.epsilon < previous.epsilon * ROLLBACK_TOLERANCE \
            else None
        label = self.metrics.device_label(device)
        epsilon = spent.epsilon if previous is None else max(previous.epsilon, spent.epsilon)
        record = AgentPrivacy(label, epsilon, spent.delta, spent.exhausted)
        if record == previous:
            return behind
        if previous is not None and previous.device != label:  # the same id on another device class
            self.forget(agent_id)
            previous = None
        self._agents[agent_id] = record
        m = self.metrics
        if epsilon > self._device_max.get(label, -1.0):
            self._device_max[label] = epsilon
            m.epsilon.labels(label).set(epsilon)
        count = self._device_exhausted.get(label, 0) + record.exhausted - (previous.exhausted if previous else 0)
        self._device_exhausted[label] = count
        m.budget_exhausted.labels(label).set(count)
        if self._max is None or epsilon > self._max:
            self._max = epsilon
            m.epsilon_max.set(epsilon)
        return behind

    def forget(self, agent_id: str) -> None:
        """A cleared retained status: the agent was decommissioned."""
        if self._agents.pop(agent_id, None) is None:
            return
        m = self.metrics
        for device in self._device_max:
            m.epsilon.remove(device)
            m.budget_exhausted.remove(device)
        self._device_max, self._device_exhausted = {}, {}
        for agent in self._agents.values():
            self._device_max[agent.device] = max(agent.epsilon, self._device_max.get(agent.device, 0.0))
            self._device_exhausted[agent.device] = self._device_exhausted.get(agent.device, 0) + agent.exhausted
        for device, epsilon in self._device_max.items():
            m.epsilon.labels(device).set(epsilon)
            m.budget_exhausted.labels(device).set(self._device_exhausted[device])
        self._max = max(self._device_max.values(), default=None)
        m.epsilon_max.set(0.0 if self._max is None else self._max)

    @property
    def epsilon_max(self) -> float | None:
        return self._max

    @property
    def exhausted(self) -> int:
        return sum(self._device_exhausted.values())
