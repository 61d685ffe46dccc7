"""What the coordinator knows about agents: their last status and when it was heard."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from coordinator.fleet.freshness import StatusMark, advanced
from coordinator.fleet.live import EVALUABLE_STATES, LiveIndex
from protocol.messages import AgentStatus, PrivacySpent


@dataclass
class AgentRecord:
    status: AgentStatus
    """Replaced only by the registry's methods: its live index counts each record by the status it was told of."""
    last_seen: float
    """Coordinator clock (monotonic) at the last status received, not the agent's own clock."""
    reconnects: int = 0
    """Most reconnects this agent process has reported (a last will repeats the count of its connect)."""

    @property
    def agent_id(self) -> str:
        return self.status.agent_id

    def heard_within(self, now: float, timeout_s: float) -> bool:
        return now - self.last_seen <= timeout_s

    def can_train(self) -> bool:
        """Says it is online and that its privacy budget, if any, is not spent."""
        privacy = self.status.privacy
        return self.status.state == "online" and (privacy is None or not privacy.exhausted)


@dataclass(frozen=True)
class Observation:
    """What one status told about an agent, compared with the status before it."""

    restarted: bool
    """Its process changed since the last status: it restarted (or a second device uses its id)."""
    new_reconnects: int
    """Reconnects it made since the last status this coordinator saw."""
    evicted: str | None = None
    """The longest-silent agent the registry let go to make room for this one (whatever else is kept per agent
    must let it go too)."""


MAX_RECONNECTS_PER_STATUS = 1_000
"""Reconnects one status may add to the metrics (agents report their own counts)."""


class RegistryFull(Exception):
    """Every remembered agent was heard within the timeout: a new one cannot be taken in."""


class AgentRegistry:
    """Bounded: at most ``capacity`` agents. Records are kept in the order they were last heard,
    so when a new agent arrives at capacity the longest-silent one is forgotten in O(1) - if it
    was silent past the timeout; otherwise the newcomer is refused (``RegistryFull``), and a
    flood of made-up ids cannot push live agents out or grow memory."""

    def __init__(self, timeout_s: float, capacity: int = 50_000) -> None:
        self.timeout_s = timeout_s
        self.capacity = capacity
        self._agents: OrderedDict[str, AgentRecord] = OrderedDict()
        self._marks: OrderedDict[str, StatusMark] = OrderedDict()
        """The newest (epoch, seq) heard per agent (``coordinator.fleet.freshness``), kept when its record is
        forgotten so that a replay cannot bring it back; as bounded as the records, least recently heard out."""
        self._index = LiveIndex(self._agents, timeout_s)
        """Who is live now and their counts, kept by changes: every write to ``_agents`` tells it."""

    def refusal(self, agent_id: str, now: float) -> str | None:
        """Why a status of ``agent_id`` cannot be recorded now (full of live agents), or None. Reads only."""
        if agent_id in self._agents or len(self._agents) < self.capacity:
            return None
        oldest = next(iter(self._agents.values()))
        if oldest.heard_within(now, self.timeout_s):
            return f"{len(self._agents)} agents known, all heard within {self.timeout_s:g}s"
        return None

    def stale(self, status: AgentStatus) -> str | None:
        """Why ``status`` is older than the newest one heard from its agent (a replay), or None. Reads only."""
        mark = self._marks.get(status.agent_id)
        return None if mark is None else mark.staleness(status.epoch, status.seq)

    def marks(self) -> dict[str, list[int]]:
        """The freshness marks, for the state directory: a restarted coordinator still knows what is old."""
        return {agent_id: mark.to_list() for agent_id, mark in self._marks.items()}

    def load_marks(self, saved: dict[str, list[int]]) -> None:
        for agent_id, mark in list(saved.items())[-self.capacity:]:
            self._marks[agent_id] = StatusMark.from_list(mark)

    def _close_mark(self, agent_id: str) -> None:
        mark = self._marks.get(agent_id)
        if mark is not None:
            mark.closed = True

    def family_of(self, agent_id: str) -> str | None:
        record = self._agents.get(agent_id)
        return None if record is None else record.status.family

    def spent(self, agent_id: str) -> bool:
        """Whether its DP budget is spent: its status or an update said so, or its ledger went back (marked spent
        until it reports the highest figure again). It trains no more."""
        record = self._agents.get(agent_id)
        if record is None:
            return False
        privacy = record.status.privacy
        return record.status.state == "budget_exhausted" or (privacy is not None and privacy.exhausted)

    def observe(self, status: AgentStatus, now: float) -> Observation:
        """Record ``status`` and say how it differs from the previous one; raises RegistryFull
        (a bug: admission asks :meth:`refusal` first).

        Reconnects are counted from the second status of a process on, so that a coordinator
        restart does not count the fleet's earlier reconnects again.
        """
        previous = self._agents.get(status.agent_id)
        evicted = None
        if previous is None and len(self._agents) >= self.capacity:
            oldest = next(iter(self._agents.values()))
            refusal = self.refusal(status.agent_id, now)
            if refusal is not None:
                raise RegistryFull(refusal)
            del self._agents[oldest.agent_id]
            self._index.dropped(oldest.agent_id)
            self._close_mark(oldest.agent_id)
            evicted = oldest.agent_id
        self._marks[status.agent_id] = advanced(self._marks.get(status.agent_id), status.epoch, status.seq)
        self._marks.move_to_end(status.agent_id)
        if len(self._marks) > self.capacity:
            self._marks.popitem(last=False)
        restarted = (previous is not None and status.session is not None
                     and previous.status.session is not None and status.session != previous.status.session)
        if previous is None:
            new_reconnects = 0
        elif restarted:
            new_reconnects = status.reconnects
        else:
            new_reconnects = max(0, status.reconnects - previous.reconnects)
        new_reconnects = min(new_reconnects, MAX_RECONNECTS_PER_STATUS)  # a counter one status cannot inflate
        seen = status.reconnects if previous is None or restarted else max(previous.reconnects, status.reconnects)
        self._agents[status.agent_id] = AgentRecord(status, now, seen)
        self._agents.move_to_end(status.agent_id)
        self._index.heard(status.agent_id)
        return Observation(restarted=restarted, new_reconnects=new_reconnects, evicted=evicted)

    def forget_silent(self, now: float, after_s: float) -> list[str]:
        """Forget agents not heard from for ``after_s``: gone for good, they hold no memory here."""
        gone = []
        while self._agents:
            oldest = next(iter(self._agents.values()))
            if now - oldest.last_seen <= after_s:
                break
            gone.append(oldest.agent_id)
            del self._agents[oldest.agent_id]
            self._index.dropped(oldest.agent_id)
            self._close_mark(oldest.agent_id)
        return gone

    def budget_spent(self, agent_id: str, privacy: PrivacySpent) -> None:
        """An update said the agent's DP budget is spent: stop selecting it now, not at its next status."""
        record = self._agents.get(agent_id)
        if record is not None:
            record.status = record.status.model_copy(update={"state": "budget_exhausted", "privacy": privacy})
            self._index.changed(agent_id)

    def touch(self, agent_ids: list[str], now: float) -> list[str]:
        """Agents a site still hears (its roster's ``present``): heard now, their statuses unchanged. Returns the
        ids this registry does not know (their statuses were never taken here, or were forgotten)."""
        agents, index, unknown = self._agents, self._index, []
        for agent_id in agent_ids:
            record = agents.get(agent_id)
            if record is None:
                unknown.append(agent_id)
                continue
            record.last_seen = now
            agents.move_to_end(agent_id)
            index.heard(agent_id)
        return unknown

    def forget(self, agent_id: str) -> None:
        """A cleared retained status: the agent was decommissioned."""
        if self._agents.pop(agent_id, None) is not None:
            self._index.dropped(agent_id)
        self._close_mark(agent_id)

    def __len__(self) -> int:
        return len(self._agents)

    def agent_ids(self) -> list[str]:
        return list(self._agents)

    def get(self, agent_id: str) -> AgentRecord | None:
        return self._agents.get(agent_id)

    def is_online(self, agent_id: str, now: float) -> bool:
        """Connected and heard from within the timeout (a budget-exhausted agent is online but idle)."""
        record = self._agents.get(agent_id)
        return record is not None and record.status.state != "offline" and record.heard_within(now, self.timeout_s)

    def available(self, now: float) -> list[AgentRecord]:
        """Agents that may be selected to train: online, heard from recently, budget not spent; sorted by id."""
        index, agents = self._index, self._agents
        return [agents[a] for a in index.sorted_ids(now) if index.counted(a).trains]

    def available_count(self, now: float) -> int:
        """``len(self.available(now))`` in O(devices)."""
        return self._index.available_count(now)

    def evaluable_count(self, now: float) -> int:
        """``len(self.evaluable(now))`` in O(1)."""
        return self._index.evaluable_count(now)

    def evaluable(self, now: float) -> list[AgentRecord]:
        """Agents that may score a model on their held-out data: the available ones, and those whose DP
        budget is spent (evaluation trains nothing and spends no budget; their training records stay out)."""
        index, agents = self._index, self._agents
        return [agents[a] for a in index.sorted_ids(now) if index.counted(a).state in EVALUABLE_STATES]

    def budget_spent_count(self, now: float) -> int:
        return self._index.budget_spent(now)

    def count_by_family(self) -> dict[str, int]:
        """Agents known per model family, online or not: the population a round samples from."""
        return dict(Counter(r.status.family for r in self._agents.values()))

    def online_by_device(self, now: float) -> Counter[str]:
        """Available agents (:meth:`available`) per device: O(devices), read on every gauge refresh."""
        return self._index.available_by_device(now)

    def denied_by_device(self, now: float) -> Counter[str]:
        """Agents heard within the timeout whose broker refused some of their messages (``denied``)."""
        return self._index.denied_by_device(now)
