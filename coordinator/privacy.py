"""The fleet's privacy spending as agents report it, in their updates and in their statuses.

Statuses count too: an agent whose budget is spent sends no more updates, but its retained
status still carries what it spent. Per agent the largest epsilon ever reported is kept, so
the exported figures never go down while the coordinator runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.metrics import CoordinatorMetrics
from protocol.messages import PrivacySpent


@dataclass(frozen=True)
class AgentPrivacy:
    device: str
    """Metric label of the agent's device class."""
    epsilon: float
    delta: float
    exhausted: bool


class FleetPrivacy:
    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics
        self._agents: dict[str, AgentPrivacy] = {}
        self._exported_devices: set[str] = set()

    def observe(self, agent_id: str, device: str, spent: PrivacySpent | None) -> None:
        if spent is None:
            return
        previous = self._agents.get(agent_id)
        epsilon = spent.epsilon if previous is None else max(previous.epsilon, spent.epsilon)
        self._agents[agent_id] = AgentPrivacy(self.metrics.device_label(device), epsilon, spent.delta,
                                              spent.exhausted)
        self._export()

    def forget(self, agent_id: str) -> None:
        """A cleared retained status: the agent was decommissioned."""
        if self._agents.pop(agent_id, None) is not None:
            self._export()

    @property
    def epsilon_max(self) -> float | None:
        return max((a.epsilon for a in self._agents.values()), default=None)

    @property
    def exhausted(self) -> int:
        return sum(1 for a in self._agents.values() if a.exhausted)

    def by_device(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for agent in self._agents.values():
            out[agent.device] = max(agent.epsilon, out.get(agent.device, 0.0))
        return out

    def _export(self) -> None:
        m = self.metrics
        devices = self.by_device()
        for gone in self._exported_devices - devices.keys():
            m.epsilon.remove(gone)
            m.budget_exhausted.remove(gone)
        for device, epsilon in devices.items():
            m.epsilon.labels(device).set(epsilon)
            m.budget_exhausted.labels(device).set(
                sum(1 for a in self._agents.values() if a.device == device and a.exhausted))
        self._exported_devices = set(devices)
        epsilon_max = self.epsilon_max
        m.epsilon_max.set(0.0 if epsilon_max is None else epsilon_max)
