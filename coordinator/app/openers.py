"""Updates opened on a small pool ahead of the loop, handed to the loop in the inbox's order.

Opening an update (its signature's SHA-256, decoding, validation, its delta's norm) was most of
what the loop spent per update, one after another: 0.5 to 1 ms for a 127k-parameter update,
5 to 10 s of a 10,000-agent round. hashlib, OpenSSL and numpy's BLAS let go of the GIL on large
buffers, so two workers open the next updates while the loop folds this one.

The loop takes items from the fair inbox as before (so fairness and the inbox's bounds are
unchanged) and submits each update message to the pool as it takes it; it then handles items
strictly in the order it took them, waiting for an update's opening when it is not done yet.
So the engine sees exactly the sequence it saw without the pool (a sender's status before its
update, one sender's chunks in order) and stays single-threaded; only ``Intake.open``, which
reads no run state, runs on the workers. Memory: at most ``depth`` messages are out of the
inbox and not yet handled, on top of the inbox's own budget. Nothing here publishes: the MQTT
network thread stays the only writer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from coordinator.admission.intake import Opened
from coordinator.app.inbox import FairInbox, Item

UPDATE = "update"
"""Kind of an inbox item that is an update message: ``(UPDATE, topic, payload)``, opened on the pool."""
WORKERS = 2
DEPTH = 8
"""Items taken from the inbox ahead of the one being handled: enough to keep both workers busy."""


class Openers:
    def __init__(self, inbox: FairInbox, open_update: Callable[[bytes, str], Opened], *, workers: int = WORKERS,
                 depth: int = DEPTH) -> None:
        """``open_update``: ``Intake.open`` (thread-safe); workers 0: opened on the loop, when handled."""
        self.inbox = inbox
        self.open_update = open_update
        self.depth = max(1, depth)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="open") if workers > 0 else None
        self._taken: deque[tuple[Item, Future[Opened] | None]] = deque()

    def next(self, timeout: float | None) -> tuple[Item, Opened | None] | None:
        """The next item in the inbox's order, with its opening when it is an update (waited for); None once
        ``timeout`` passed with nothing queued."""
        self._take(timeout if not self._taken else 0)
        if not self._taken:
            return None
        item, opening = self._taken.popleft()
        self._take(0)  # keep the workers busy while the loop handles this one
        return item, None if opening is None else opening.result()

    def _take(self, timeout: float | None) -> None:
        while len(self._taken) < self.depth:
            item = self.inbox.get(timeout=timeout)
            if item is None:
                return
            timeout = 0
            opening = None
            if item[0] == UPDATE and self._pool is not None:
                opening = self._pool.submit(self.open_update, item[2], item[1])
            self._taken.append((item, opening))

    @property
    def pending(self) -> int:
        """Items taken from the inbox and not yet handed to the loop."""
        return len(self._taken)

    def close(self) -> None:
        """Drop what was taken and not handled (the loop stopped) and let the workers go."""
        self._taken.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
