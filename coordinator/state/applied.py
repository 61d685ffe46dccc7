"""The newest version whose update of each agent was applied: an update is applied at most once.

Asynchronous rounds accept updates of earlier versions (within ``max_staleness``), so a genuine
signed update replayed later would otherwise count again in another buffer. Kept in the
checkpoint, so a restarted coordinator still refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class AppliedVersions:
    def __init__(self) -> None:
        self._newest: dict[str, int] = {}

    def record(self, agent_id: str, version: int) -> None:
        self._newest[agent_id] = max(version, self._newest.get(agent_id, version))

    def newest(self, agent_id: str) -> int | None:
        return self._newest.get(agent_id)

    def prune(self, below: int) -> None:
        """Let go of agents whose newest applied version is under ``below``: any update of theirs that could be
        replayed is older still, and refused as too stale before this is asked. (Not per agent: an agent being
        forgotten, on an unsigned empty status say, must not make its captured update count again.)"""
        self._newest = {agent: version for agent, version in self._newest.items() if version >= below}

    def state_dict(self) -> dict[str, int]:
        return dict(self._newest)

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        if not all(isinstance(a, str) and isinstance(v, int) and not isinstance(v, bool) for a, v in saved.items()):
            raise ValueError("checkpoint: applied versions must map agent ids to round numbers")
        self._newest = dict(saved)
