"""What a site aggregator tells the root of its agents: a ``SiteRoster`` in place of their statuses.

The site keeps, per agent, the newest status it admitted and the content of the last one it sent up
(everything but ``timestamp`` and ``seq``: a heartbeat that changes nothing else is not news). A roster
goes up when there is news, at most every ``BATCH_S`` (statuses arriving together travel together), and
every ``interval_s`` in any case with ``present``: the ids of every agent the site heard from since the
last such list, which keeps them live at the root (each is heard there within an interval of when it
was heard here, so an agent that falls silent times out at the root as if it had spoken to it). Statuses the root asked for (``SiteResync``) go in the next
roster whatever their content. More than ``MAX_ROSTER_STATUSES`` statuses take several rosters in a row.
"""

from __future__ import annotations

from protocol.messages import AgentStatus
from protocol.site_rosters import MAX_ROSTER_STATUSES, MAX_SITE_AGENTS, SiteRoster
from protocol.wire import encode_message

BATCH_S = 0.5
"""News waits at most this long for more news to travel with."""


def content_of(status: AgentStatus) -> bytes:
    """What makes a status news: its encoding without its clock and counter."""
    return encode_message(status.model_copy(update={"timestamp": 0.0, "seq": 0}))


class RosterBook:
    def __init__(self, site_id: str, interval_s: float, started_at: float) -> None:
        self.site_id, self.interval_s, self.started_at = site_id, interval_s, started_at
        self.seq = 0
        self.latest: dict[str, AgentStatus] = {}
        self._sent: dict[str, bytes] = {}
        self._news: set[str] = set()
        self._gone: set[str] = set()
        self._heard: set[str] = set()
        """Heard from since the last ``present`` list."""
        self._last_sent = -float("inf")
        self._next_present = -float("inf")

    def heard(self, status: AgentStatus) -> None:
        """A status the site admitted (as admission left it: label counts kept, unless refused)."""
        agent_id = status.agent_id
        self.latest[agent_id] = status
        self._heard.add(agent_id)
        self._gone.discard(agent_id)
        if self._sent.get(agent_id) != content_of(status):
            self._news.add(agent_id)

    def forgot(self, agent_id: str) -> None:
        """The site forgot the agent (a cleared retained status): the root forgets it too."""
        self.latest.pop(agent_id, None)
        self._news.discard(agent_id)
        self._heard.discard(agent_id)
        if self._sent.pop(agent_id, None) is not None:
            self._gone.add(agent_id)

    def resync(self, agents: list[str] | None) -> None:
        """The root asked for these agents' statuses (None: every agent's)."""
        wanted = self.latest.keys() if agents is None else (a for a in agents if a in self.latest)
        self._news.update(wanted)

    def due_in(self, now: float) -> float:
        """Seconds until the next roster is due (0: now)."""
        news = self._last_sent + BATCH_S - now if self._news or self._gone else float("inf")
        return max(0.0, min(news, self._next_present - now))

    def rosters(self, now: float) -> list[SiteRoster]:
        """The rosters due now (none if none is), recording what they tell."""
        if self.due_in(now) > 0:
            return []
        news = sorted(self._news)
        batches = [news[i:i + MAX_ROSTER_STATUSES] for i in range(0, len(news), MAX_ROSTER_STATUSES)] or [[]]
        with_present = now >= self._next_present
        live = sorted(self._heard)[:MAX_SITE_AGENTS] if with_present else None
        gone = sorted(self._gone)[:MAX_SITE_AGENTS]
        out = []
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            self.seq += 1
            statuses = [self.latest[a] for a in batch]
            out.append(SiteRoster(site_id=self.site_id, started_at=self.started_at, seq=self.seq, statuses=statuses,
                                  gone=gone if i == 0 else [], present=live if last else None))
            for status in statuses:
                self._sent[status.agent_id] = content_of(status)
        self._news.clear()
        self._gone.difference_update(gone)
        self._last_sent = now
        if with_present:
            self._heard.clear()
            self._next_present = now + self.interval_s
        return out
