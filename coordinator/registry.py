"""What the coordinator knows about agents: their last status and when it was heard."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from protocol.messages import AgentStatus


@dataclass
class AgentRecord:
    status: AgentStatus
    last_seen: float
    """Coordinator clock (monotonic) at the last status received, not the agent's own clock."""

    @property
    def agent_id(self) -> str:
        return self.status.agent_id


class AgentRegistry:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._agents: dict[str, AgentRecord] = {}

    def observe(self, status: AgentStatus, now: float) -> AgentRecord:
        record = AgentRecord(status, now)
        self._agents[status.agent_id] = record
        return record

    def forget(self, agent_id: str) -> None:
        """A cleared retained status: the agent was decommissioned."""
        self._agents.pop(agent_id, None)

    def get(self, agent_id: str) -> AgentRecord | None:
        return self._agents.get(agent_id)

    def is_online(self, agent_id: str, now: float) -> bool:
        record = self._agents.get(agent_id)
        return (
            record is not None
            and record.status.state == "online"
            and now - record.last_seen <= self.timeout_s
        )

    def available(self, now: float) -> list[AgentRecord]:
        """Agents that may be selected: online, heard from recently, budget not spent."""
        return sorted(
            (r for r in self._agents.values() if self.is_online(r.agent_id, now)),
            key=lambda r: r.agent_id,
        )

    def count_by_family(self) -> dict[str, int]:
        """Agents known per model family, online or not: the population a round samples from."""
        return dict(Counter(r.status.family for r in self._agents.values()))

    def online_by_device(self, now: float) -> Counter[str]:
        return Counter(r.status.device for r in self.available(now))

    def __len__(self) -> int:
        return len(self._agents)
