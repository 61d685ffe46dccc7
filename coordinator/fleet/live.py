"""The agents heard within the timeout, kept up to date by changes instead of recounted on every tick.

The registry asks "who is live now, and how many per device" every second (the gauges) and at
every round opening. Recounting means a scan and a sort of every record: O(agents) per tick,
which at a root with tens of thousands of agents costs more than the statuses themselves. Here
the live set and its counts change only when a status arrives, a record goes, or a record's
last status grows older than the timeout; expiries are found in a queue of (heard at, agent)
in arrival order, so each tick pops only what expired since the last one: O(changes).

The answers are exactly those of a recount at the same ``now`` (tests/unit/coordinator/fleet
checks this under random sequences). The queue's order relies on a clock that does not go back;
if it does (a status stamped, or a question asked, earlier than one before), the index recounts
once from the records and carries on from there.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from protocol.messages import AgentStatus


class Record(Protocol):
    """What the index reads of the registry's ``AgentRecord`` (agents.py imports this module, not the reverse)."""

    status: AgentStatus
    last_seen: float

    def can_train(self) -> bool: ...

    def heard_within(self, now: float, timeout_s: float) -> bool: ...


EVALUABLE_STATES = ("online", "budget_exhausted")
"""Live agents in these states may score a model (evaluation spends no privacy budget)."""


@dataclass(frozen=True)
class Counted:
    """What a live record added to the counts, so that exactly that is taken back when it changes."""

    device: str
    state: str
    trains: bool
    denied: bool


def _counted(record: Record) -> Counted:
    status = record.status
    return Counted(status.device, status.state, record.can_train(), bool(status.denied))


class LiveIndex:
    """Live records of ``records`` (the registry's own mapping, read here, never written) and their counts.

    The registry tells it of every change: :meth:`heard` after a record was stored with a new
    ``last_seen``, :meth:`changed` after a record's status changed in place, :meth:`dropped`
    after a record was removed.
    """

    def __init__(self, records: Mapping[str, Record], timeout_s: float) -> None:
        self._records = records
        self._timeout_s = timeout_s
        self._live: dict[str, Counted] = {}
        self._expiry: deque[tuple[float, str]] = deque()
        """(last_seen, agent) per status heard, in order of last_seen; stale entries are skipped when popped."""
        self._tail = -math.inf
        """The latest last_seen queued: a status heard earlier than it would break the queue's order."""
        self._clock = -math.inf
        """The latest ``now`` the live set stands for."""
        self._dirty = False
        """The clock went back: recount from the records before the next answer."""
        self._sorted: list[str] | None = None
        """The live ids sorted, until the live set's membership changes."""
        self._available: Counter[str] = Counter()
        self._denied: Counter[str] = Counter()
        self._spent = 0
        self._evaluable = 0

    # -- changes ------------------------------------------------------------------------
    def heard(self, agent_id: str) -> None:
        was_live = self._uncount(agent_id)
        if self._dirty:
            return
        record = self._records[agent_id]
        seen = record.last_seen
        if seen < self._tail:
            self._dirty = True
            return
        if seen > self._clock:
            self._advance(seen)  # keeps the queue as short as the timeout's worth of statuses
        self._expiry.append((seen, agent_id))
        self._tail = seen
        if self._clock - seen <= self._timeout_s:
            self._count(agent_id, record)
        if was_live != (agent_id in self._live):
            self._sorted = None

    def changed(self, agent_id: str) -> None:
        if agent_id in self._live:
            self._uncount(agent_id)
            self._count(agent_id, self._records[agent_id])

    def dropped(self, agent_id: str) -> None:
        if self._uncount(agent_id):  # its queued entries find no record, or a newer one, and are skipped
            self._sorted = None

    # -- answers --------------------------------------------------------------------------
    def sorted_ids(self, now: float) -> list[str]:
        """Live ids, sorted. The list is shared until the membership changes: do not modify it."""
        self._at(now)
        if self._sorted is None:
            self._sorted = sorted(self._live)
        return self._sorted

    def counted(self, agent_id: str) -> Counted:
        return self._live[agent_id]

    def available_count(self, now: float) -> int:
        self._at(now)
        return sum(self._available.values())

    def evaluable_count(self, now: float) -> int:
        self._at(now)
        return self._evaluable

    def available_by_device(self, now: float) -> Counter[str]:
        self._at(now)
        return Counter(self._available)

    def denied_by_device(self, now: float) -> Counter[str]:
        self._at(now)
        return Counter(self._denied)

    def budget_spent(self, now: float) -> int:
        self._at(now)
        return self._spent

    # -- bookkeeping ----------------------------------------------------------------------
    def _at(self, now: float) -> None:
        if self._dirty or now < self._clock:
            self._recount(now)
        else:
            self._advance(now)

    def _advance(self, now: float) -> None:
        """Move the clock forward to ``now``: whoever was last heard more than the timeout ago leaves."""
        self._clock = now
        timeout, expiry = self._timeout_s, self._expiry
        while expiry and not now - expiry[0][0] <= timeout:  # the negation of heard_within, to the bit
            _, agent_id = expiry.popleft()
            if agent_id in self._live and not self._records[agent_id].heard_within(now, timeout):
                self._uncount(agent_id)
                self._sorted = None

    def _recount(self, now: float) -> None:
        self._live.clear()
        self._available.clear()
        self._denied.clear()
        self._spent = 0
        self._evaluable = 0
        self._sorted = None
        self._clock = now
        self._dirty = False
        live = sorted(((r.last_seen, agent_id) for agent_id, r in self._records.items()
                       if r.heard_within(now, self._timeout_s)), key=lambda entry: entry[0])
        self._expiry = deque(live)
        self._tail = live[-1][0] if live else -math.inf
        for _, agent_id in live:
            self._count(agent_id, self._records[agent_id])

    def _count(self, agent_id: str, record: Record) -> None:
        """Add ``record``'s share; the caller invalidates the sorted ids when the membership changes."""
        counted = _counted(record)
        self._live[agent_id] = counted
        if counted.trains:
            self._available[counted.device] += 1
        if counted.denied:
            self._denied[counted.device] += 1
        if counted.state == "budget_exhausted":
            self._spent += 1
        if counted.state in EVALUABLE_STATES:
            self._evaluable += 1

    def _uncount(self, agent_id: str) -> bool:
        """Take back what ``agent_id`` added, if it was live; whether it was. The caller says whether the
        membership changed (a status replacing a live one's does not)."""
        counted = self._live.pop(agent_id, None)
        if counted is None:
            return False
        if counted.trains:
            _decrement(self._available, counted.device)
        if counted.denied:
            _decrement(self._denied, counted.device)
        if counted.state == "budget_exhausted":
            self._spent -= 1
        if counted.state in EVALUABLE_STATES:
            self._evaluable -= 1
        return True


def _decrement(counts: Counter[str], key: str) -> None:
    """One fewer; a key at zero goes, as a recount would never have it."""
    if counts[key] <= 1:
        del counts[key]
    else:
        counts[key] -= 1
