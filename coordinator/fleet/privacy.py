"""The fleet's privacy spending as agents report it, in their updates and in their statuses.

Statuses count too: an agent whose budget is spent sends no more updates, but its retained
status still carries what it spent. Per agent the largest epsilon ever reported is kept, so
the exported figures never go down while the coordinator runs (unless an agent is removed).

An agent's ledger only grows. One that reports less than it did (a restored backup of its state
directory, a wiped one under a fixed id) would train again on data whose budget is spent: the
engine then stops selecting it to train until it reports at least as much again. The highest figures
are kept in the checkpoint (``state_dict``), so a restarted coordinator, which hears only the retained
statuses (perhaps the rolled-back one), still knows what each agent spent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
        if self._agents.pop(agent_id, None) is not None:
            self._recount()

    def state_dict(self) -> dict[str, list[Any]]:
        """Per agent: [device label, highest epsilon, delta, exhausted]."""
        return {agent: [r.device, r.epsilon, r.delta, r.exhausted] for agent, r in sorted(self._agents.items())}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Merge a checkpoint's figures with what was heard since (the larger epsilon of each agent wins)."""
        for agent, entry in saved.items():
            if not (isinstance(agent, str) and isinstance(entry, list) and len(entry) == 4
                    and isinstance(entry[0], str) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          and math.isfinite(x) and x >= 0 for x in entry[1:3])
                    and isinstance(entry[3], bool)):
                raise ValueError(f"checkpoint: privacy of {agent!r} must be [device, epsilon, delta, exhausted]")
        for agent, (device, epsilon, delta, exhausted) in saved.items():
            current = self._agents.get(agent)
            if current is None or current.epsilon < epsilon:
                label = current.device if current is not None else self.metrics.device_label(device)
                self._agents[agent] = AgentPrivacy(label, float(epsilon), float(delta), exhausted)
        self._recount()

    def _recount(self) -> None:
        """The per-device figures and the fleet's largest, from every agent's record."""
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
