"""The newest status heard from each agent, so that a replayed older one changes nothing.

A signature proves who wrote a status, not when: anyone on an open broker can capture an agent's
genuine status and publish it again later. Each status therefore carries the agent process's
``epoch`` (higher at every process start, kept in the agent's state directory) and its ``seq``
(1, 2, ... within the process; 0 is the process's last will, registered with the broker at
start). (epoch, seq) orders an agent's statuses; the registry keeps the newest per agent
(``StatusMark``) and admission refuses an older one (``stale_status``).

The last will needs care: it is written before the statuses it follows, so its ``seq`` says
nothing. A will is taken once per process: it is the newest until a status of the same process
follows it (the agent reconnected). A replay of it after that is stale, and so, unavoidably, is
the genuine will of a second broken connection of the same process: that agent is then seen
offline only when it times out.

Epoch 0 is an agent that predates freshness: its statuses are not ordered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class StatusMark:
    epoch: int
    """The agent process's epoch."""
    seq: int
    """The highest regular status (``seq`` >= 1) heard from that process; 0 when only its will was."""
    will_after: int | None = None
    """The process's last will was taken after its status ``will_after``; None: not taken yet."""
    closed: bool = False
    """The agent was forgotten (silent, evicted, decommissioned): only a newer status brings it back."""

    def staleness(self, epoch: int, seq: int) -> str | None:
        """Why a status (``epoch``, ``seq``) is older than this newest one; None when it is not.

        The newest status again (retained, delivered again after a reconnect) is not stale, unless the
        agent was forgotten since.
        """
        if epoch < self.epoch:
            return f"process epoch {epoch}, newest heard {self.epoch}"
        if epoch > self.epoch or epoch == 0:
            return None
        will_newest = self.will_after == self.seq
        if seq == 0:
            if self.will_after is None or (will_newest and not self.closed):
                return None
            return f"a last will of process epoch {epoch} was already taken"
        if seq > self.seq or (seq == self.seq and not will_newest and not self.closed):
            return None
        return f"status {seq} of process epoch {epoch}, newest heard {self.seq}{' and its last will' * will_newest}"

    def to_list(self) -> list[int]:
        return [self.epoch, self.seq, -1 if self.will_after is None else self.will_after, int(self.closed)]

    @classmethod
    def from_list(cls, data: Any) -> StatusMark:
        epoch, seq, will_after, closed = (int(v) for v in data)
        return cls(epoch, seq, None if will_after < 0 else will_after, bool(closed))


def advanced(mark: StatusMark | None, epoch: int, seq: int) -> StatusMark:
    """The mark after taking the status (``epoch``, ``seq``), which ``staleness`` let through."""
    if mark is None or epoch != mark.epoch:
        return StatusMark(epoch, seq, 0 if seq == 0 else None)
    if seq == 0:
        return StatusMark(epoch, mark.seq, mark.seq)
    return StatusMark(epoch, max(seq, mark.seq), mark.will_after)
