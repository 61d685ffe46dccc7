"""Freshness on the agent: which run it follows, and the order of its own statuses (docs/protocol.md, Freshness).

A signature proves that the coordinator's key wrote a message, not that it belongs to the run
going on now: an earlier run's genuine "finished" status, announcements and global states can
be published again during a later run. Every message the coordinator signs carries its run's
``epoch``, which only moves forward; the agent keeps the newest epoch it accepted, with that
run's id, in its state directory (``freshness.json``), and:

* drops what an older epoch signed (``stale_epoch``), whatever it says about itself;
* follows a newer epoch at once: a coordinator that started a new run (the agent then forgets
  what older epochs said: announcement, global states, coordinator status);
* within its epoch, acts on a "finished" or "offline" status only of its own run
  (``inconsistent`` otherwise); an announcement, global state or "online" status of another run
  at the same epoch moves it to that run (two runs share an epoch only when their coordinator
  predates epochs, epoch 0: then this is how agents behaved before).

A rebooted agent reads the file back and keeps accepting the run it was in. Only an agent that
pinned the coordinator's key keeps the file: an unverified message could otherwise plant an
epoch no genuine run reaches.

The agent's own statuses carry its process ``epoch`` (higher at every start: the wall clock in
milliseconds, or one more than the last, kept in the same file) and a ``seq`` counted from 1
within the process (0 is its last will), so that the coordinator can refuse a replayed old one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.state import AgentStateDir
from protocol.messages import RoundAnnouncement

FILE = "freshness"
STALE_EPOCH = "stale_epoch"
INCONSISTENT = "inconsistent"


@dataclass(frozen=True)
class Verdict:
    reason: str | None = None
    """Drop the message, counted with this reason; None: act on it."""
    detail: str = ""
    advanced: bool = False
    """A newer epoch: what older epochs said is to be forgotten."""


class Freshness:
    def __init__(self, state: AgentStateDir, *, persist: bool = True,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.persist = persist
        saved = state.read_json(FILE) or {}
        try:
            epoch, previous = int(saved.get("coordinator_epoch", 0)), int(saved.get("process_epoch", 0))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"{state.root / (FILE + '.json')} is malformed ({exc!r}); move it away to reset "
                             f"it") from None
        self.epoch = epoch if persist else 0
        """The newest coordinator epoch accepted."""
        self.run_id: str | None = saved.get("run_id") if persist else None
        """The run this agent is in: the one of that epoch."""
        self.process_epoch = max(int(wall_clock() * 1000), previous + 1)
        """This process's epoch, in its statuses."""
        self._seq = itertools.count(1)
        self._save()

    def next_seq(self) -> int:
        """The sequence number of the next status this process publishes."""
        return next(self._seq)

    def judge(self, epoch: int, run_id: str, *, ends_run: bool = False) -> Verdict:
        """A coordinator message of ``epoch`` and ``run_id``; ``ends_run``: a "finished" or "offline" status."""
        if epoch < self.epoch:
            return Verdict(STALE_EPOCH, f"run {run_id} of epoch {epoch}; this agent follows epoch {self.epoch}")
        if epoch > self.epoch:
            self.epoch, self.run_id = epoch, run_id
            self._save()
            return Verdict(advanced=True)
        if run_id != self.run_id:
            if ends_run and self.run_id is not None:
                return Verdict(INCONSISTENT, f"the end of run {run_id}; this agent is in run {self.run_id}")
            self.run_id = run_id
            self._save()
        return Verdict()

    def _save(self) -> None:
        data: dict[str, object] = {"process_epoch": self.process_epoch}
        if self.persist:
            data |= {"coordinator_epoch": self.epoch, "run_id": self.run_id}
        self.state.write_json(FILE, data)


EXPIRY_SLACK_S = 600.0
"""Device clocks drift: an announcement counts as expired only this long after its deadline."""


def announcement_refusal(ann: RoundAnnouncement, current: RoundAnnouncement | None, answered: tuple[str, int] | None,
                         now: float) -> tuple[str, str] | None:
    """(reason, detail) to drop an announcement of the run the agent follows, or None to act on it: a round older
    than the one it knows or than the one it last answered (the progress file outlives a restart: a replayed older
    round must not train, and spend, again), or one long past its deadline."""
    if current is not None and ann.run_id == current.run_id and ann.round < current.round:
        return "stale", f"round {ann.round} after round {current.round}"
    if answered is not None and ann.run_id == answered[0] and ann.round < answered[1]:
        return "stale", f"round {ann.round} after answering {answered[1]}"
    if now > ann.issued_at + ann.deadline_s + EXPIRY_SLACK_S:
        return "expired", f"round {ann.round} ended at {ann.issued_at + ann.deadline_s:.0f}"
    return None
