"""The queue between the MQTT network thread and the engine's loop, bounded in bytes.

When updates arrive faster than the loop validates and folds them, an unbounded queue holds
every payload the broker could push (10,000 updates of 0.5 MB is 5 GB): memory would depend on
how slow the loop is. Past ``max_bytes`` of queued payloads the network thread waits before
taking more, so TCP pushes back to the broker, whose queue is sized for the fleet
(docs/broker-sizing.md). Nothing is dropped; control events (connects, disconnects) never wait.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

Item = tuple[str, Any, Any]


class BoundedInbox:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: deque[tuple[Item, int]] = deque()
        self._bytes = 0
        self._closed = False
        self._changed = threading.Condition()

    def put(self, item: Item, size: int = 0) -> None:
        """Queue ``item`` of ``size`` payload bytes, first waiting while the queue is over its budget
        (one item is always let in, however large)."""
        with self._changed:
            while size and self._bytes and self._bytes + size > self.max_bytes and not self._closed:
                self._changed.wait()
            if self._closed:
                return  # the loop is gone: nothing will take it
            self._items.append((item, size))
            self._bytes += size
            self._changed.notify_all()

    def get(self, timeout: float | None = None) -> Item | None:
        """The oldest item, or None once ``timeout`` passed with nothing queued."""
        with self._changed:
            if not self._items and not self._changed.wait_for(lambda: bool(self._items), timeout):
                return None
            item, size = self._items.popleft()
            self._bytes -= size
            self._changed.notify_all()
            return item

    def close(self) -> None:
        """The loop stopped: release a waiting network thread (so the connection can close) and take no more."""
        with self._changed:
            self._closed = True
            self._items.clear()
            self._bytes = 0
            self._changed.notify_all()

    @property
    def queued_bytes(self) -> int:
        return self._bytes
