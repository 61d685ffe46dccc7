"""Local training off the agent's loop thread: one round at a time, its outcome handed back to the loop.

The loop stays the only place that changes the agent's state and decides what to publish:
this thread only calls ``worker.answer`` and gives the outcome (an update or an error) to
``post``, which puts it on the loop's inbox. The worker (its model, algorithm state and DP
ledger) is touched by this thread alone while a round trains: the loop reads the worker only
between rounds, and submits the next round only after it has handled the last outcome.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.messages import GlobalState, RoundAnnouncement, Update

if TYPE_CHECKING:
    from edge_agent.worker import LocalWorker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingOutcome:
    """What answering one round gave: an update, or the error that stopped it."""

    announcement: RoundAnnouncement
    update: Update | None
    error: Exception | None


def train_round(worker: LocalWorker, announcement: RoundAnnouncement,
                global_state: GlobalState | None) -> TrainingOutcome:
    """Answer ``announcement``; an error is returned in the outcome, not raised."""
    update: Update | None = None
    error: Exception | None = None
    try:
        update = worker.answer(announcement, global_state)
    except Exception as exc:  # noqa: BLE001 - the loop decides what each error means
        error = exc
    return TrainingOutcome(announcement, update, error)


class TrainingThread:
    """A daemon thread that trains the rounds it is given, one at a time, and posts each outcome."""

    def __init__(self, worker: LocalWorker, post: Callable[[TrainingOutcome], None], name: str = "training") -> None:
        self._worker = worker
        self._post = post
        self._jobs: queue.Queue[tuple[RoundAnnouncement, GlobalState | None] | None] = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> TrainingThread:
        self._thread.start()
        return self

    def submit(self, announcement: RoundAnnouncement, global_state: GlobalState | None) -> None:
        """Train this round next; the caller submits one round at a time (after the last one's outcome)."""
        if self._closed.is_set():
            raise RuntimeError("the training thread is closed")
        self._jobs.put((announcement, global_state))

    def close(self) -> None:
        """Stop taking rounds; a round in progress runs on (it cannot be interrupted) and its outcome is
        dropped. Does not wait: the thread is a daemon and dies with the process."""
        self._closed.set()
        self._jobs.put(None)

    def join(self, timeout_s: float | None = None) -> bool:
        """True once the thread has ended (after ``close``, when its round in progress, if any, is done)."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None or self._closed.is_set():
                return
            outcome = train_round(self._worker, *job)
            if self._closed.is_set():
                log.info("round %d finished training after the agent stopped: its outcome is dropped",
                         outcome.announcement.round)
                return
            self._post(outcome)
