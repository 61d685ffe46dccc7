"""Whom a coordinator that waits for agents is waiting for: a few names, each with why, for its log line."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable

from coordinator.fleet.agents import AgentRegistry

NAMED = 5
"""Agents named in the line at most; the rest are counted ("and K more")."""


def not_available(registry: AgentRegistry, enrolled: Iterable[str], available: Collection[str], now: float, *,
                  named: int = NAMED) -> str:
    """``"; not available: a (never seen), b (offline, broker refused 3) and K more"``, or "" when every
    agent known (enrolled, or heard from) is available. Names are the first ``named`` by id."""
    ready = set(available)
    missing = (set(enrolled) | set(registry.agent_ids())) - ready
    if not missing:
        return ""
    shown = [f"{agent_id} ({why(registry, agent_id, now)})" for agent_id in heapq.nsmallest(named, missing)]
    more = len(missing) - len(shown)
    return "; not available: " + ", ".join(shown) + (f" and {more} more" if more else "")


def why(registry: AgentRegistry, agent_id: str, now: float) -> str:
    """Why one agent cannot be selected now, as far as its last status tells."""
    record = registry.get(agent_id)
    if record is None:
        return "never seen"  # enrolled, but no status of it was accepted (not connected, or refused)
    status = record.status
    if not record.heard_within(now, registry.timeout_s):
        reason = "silent"
    elif status.state != "online":
        reason = status.state.replace("_", " ")  # offline, budget exhausted
    elif status.problem is not None:
        reason = "refuses the rounds"
    else:
        reason = "not selectable"  # e.g. another task than the one the run is pinned to
    return f"{reason}, broker refused {status.denied}" if status.denied else reason
