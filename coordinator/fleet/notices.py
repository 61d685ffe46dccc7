"""Which refusals earn the agent a notice, and how often: so an agent knows why it is not selected.

A notice (``protocol.messages.Notice``) goes only to an agent whose message was authenticated as
its own (signed by its enrolled key, or any sender when enrollment is open): a forged or unknown
sender earns nobody a notice, so a flood cannot make the coordinator publish on its behalf. At most
one notice per agent and reason per interval, and at most ``capacity`` pairs remembered (oldest out).
"""

from __future__ import annotations

from collections import OrderedDict

from coordinator.reasons import RejectReason

NOT_NOTIFIED = frozenset({
    RejectReason.SIGNER_MISMATCH,  # signed by another agent's key: not the named agent speaking
    RejectReason.TOPIC_MISMATCH,   # the topic's agent did not say this
    RejectReason.STALE_STATUS,     # a replay (a live second process is reported as duplicate_agent_id instead)
    RejectReason.DUPLICATE,        # a copy of what was already applied: the agent's resend rule expects it
})
"""Reasons that say nothing the named agent should act on."""


class NoticeLimiter:
    def __init__(self, interval_s: float, capacity: int = 10_000) -> None:
        self.interval_s = interval_s
        self.capacity = capacity
        self._last: OrderedDict[tuple[str, str], float] = OrderedDict()

    def allow(self, agent_id: str, reason: str, now: float) -> bool:
        """Whether a notice for ``reason`` may go to ``agent_id`` at ``now`` (and, if so, record that it went)."""
        if self.interval_s <= 0:
            return False
        key = (agent_id, reason)
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        if len(self._last) > self.capacity:
            self._last.popitem(last=False)
        return True


class DuplicateWatch:
    """Two live processes with one agent id: statuses of a process that is not the agent's newest keep advancing.

    Every status carries its process's ``session`` and ``seq`` (``coordinator.fleet.freshness``). A restart
    ends the old process: its statuses stop. A replay repeats a ``seq`` already heard. So a status of a
    process other than the newest one heard, with a ``seq`` above any heard from that process, or a second
    process at the same epoch, means another process is running under the same id. (A replay of statuses
    captured earlier, in order, could imitate this: the cost is a warning and a notice, nothing is refused.)
    """

    def __init__(self, capacity: int = 10_000, sessions_per_agent: int = 4) -> None:
        self.capacity = capacity
        self.sessions_per_agent = sessions_per_agent
        self._seqs: OrderedDict[str, OrderedDict[str, int]] = OrderedDict()
        self._owed: OrderedDict[str, tuple[set[str], str]] = OrderedDict()
        """Per agent id: the processes (sessions) still to be told, and what."""

    def owe(self, agent_id: str, sessions: tuple[str, ...], detail: str) -> None:
        """Both processes must hear it: a notice reaches only the one connected when it goes out (one client id),
        so each is told when its own next status shows it connected."""
        self._owed[agent_id] = ({*self._owed.get(agent_id, (set(), ""))[0], *sessions}, detail)
        self._owed.move_to_end(agent_id)
        if len(self._owed) > self.capacity:
            self._owed.popitem(last=False)

    def owed(self, agent_id: str, session: str | None) -> str | None:
        """What the process ``session`` of ``agent_id`` is still to be told, or None."""
        sessions, detail = self._owed.get(agent_id, (set(), ""))
        return detail if session in sessions else None

    def told(self, agent_id: str, session: str) -> None:
        sessions, _ = self._owed.get(agent_id, (set(), ""))
        sessions.discard(session)
        if not sessions:
            self._owed.pop(agent_id, None)

    def check(self, agent_id: str, session: str | None, epoch: int, seq: int,
              newest: tuple[str | None, int] | None) -> str | None:
        """Record a status; say why it shows a second live process, or None. ``newest``: (session, epoch) of
        the agent's newest recorded status, None when there is none."""
        if session is None or seq == 0:  # an agent predating sessions, or a last will: no order to judge
            return None
        seqs = self._seqs.setdefault(agent_id, OrderedDict())
        self._seqs.move_to_end(agent_id)
        if len(self._seqs) > self.capacity:
            self._seqs.popitem(last=False)
        heard = seqs.get(session)
        seqs[session] = max(seq, heard or 0)
        seqs.move_to_end(session)
        if len(seqs) > self.sessions_per_agent:
            seqs.popitem(last=False)
        if newest is None or newest[0] is None or newest[0] == session:
            return None
        newest_session, newest_epoch = newest
        if epoch != 0 and epoch == newest_epoch:
            return f"processes {newest_session} and {session} both run at epoch {epoch}"
        if heard is not None and seq > heard:
            return (f"process {session} (epoch {epoch}) still sends statuses ({seq} after {heard}) while process "
                    f"{newest_session} (epoch {newest_epoch}) is the newest")
        return None
