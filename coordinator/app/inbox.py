"""The queue between the MQTT network thread and the engine's loop: one queue per sender, served in turn.

Fairness: every sender (the agent id its topic names) has its own first-in first-out queue, and
the loop takes one message from each sender with something queued in turn (round-robin), so a
sender with 10,000 messages queued delays another sender's message by at most one turn. With a
single queue, honest updates once waited behind a flood until their round's deadline had passed.
Control events (connects, disconnects) go before any message and never wait.

Bounds: past ``max_bytes`` of queued payloads (or ``max_messages`` messages, however small) overall
the network thread waits before taking more, so TCP pushes back to the broker, whose queue is sized for the fleet (docs/broker-sizing.md);
memory does not depend on how slow the loop is. Waiting cannot help against one sender that sends
more than the loop takes (the rest of the connection would wait behind it), so each sender also
has bounds per lane (the message kind: statuses, updates), in messages and bytes, sized well above
what an honest agent ever has queued: a message past its sender's bound is refused (``put`` says
so, the caller counts it). A sender's first message of a lane always gets in, however large.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

Item = tuple[str, Any, Any]


@dataclass(frozen=True)
class Bound:
    """What one sender may have queued in one lane."""

    messages: int
    bytes: int


@dataclass
class _Sender:
    items: deque[tuple[Item, int, str]] = field(default_factory=deque)
    held: dict[str, list[int]] = field(default_factory=dict)
    """lane -> [messages, bytes] queued."""


class FairInbox:
    def __init__(self, max_bytes: int, bounds: Mapping[str, Bound] | None = None, max_messages: int = 100_000) -> None:
        """``bounds``: per lane, what one sender may have queued (a lane not named: only the overall budget)."""
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.bounds = dict(bounds or {})
        self._control: deque[Item] = deque()
        self._senders: dict[Hashable, _Sender] = {}
        self._turns: deque[Hashable] = deque()
        """Senders with something queued, in the order they are served."""
        self._bytes = 0
        self._count = 0
        self._waiting = 0
        self._closed = False
        self._changed = threading.Condition()

    def put(self, item: Item, size: int = 0, *, sender: Hashable = "", lane: str = "") -> bool:
        """Queue ``item`` (``size`` payload bytes) from ``sender``, first waiting while the inbox is over its
        overall budget (one item is always let in, however large). False, and nothing queued: it would take
        ``sender`` past its bound for ``lane``. After ``close`` items are taken and discarded (True)."""
        with self._changed:
            queue = self._senders.get(sender)
            held = queue.held.get(lane) if queue is not None else None
            bound = self.bounds.get(lane)
            if held and bound is not None and (held[0] + 1 > bound.messages or held[1] + size > bound.bytes):
                return False
            while self._over_budget(size) and not self._closed:
                self._waiting += 1
                try:
                    self._changed.wait()
                finally:
                    self._waiting -= 1
            if self._closed:
                return True  # the loop is gone: nothing will take it
            queue = self._senders.get(sender)  # the loop may have emptied and dropped it meanwhile
            if queue is None:
                queue = self._senders[sender] = _Sender()
                self._turns.append(sender)
            queue.items.append((item, size, lane))
            held = queue.held.setdefault(lane, [0, 0])
            held[0] += 1
            held[1] += size
            self._bytes += size
            self._count += 1
            self._changed.notify_all()
            return True

    def _over_budget(self, size: int) -> bool:
        return self._count >= self.max_messages or bool(size and self._bytes and self._bytes + size > self.max_bytes)

    def put_control(self, item: Item) -> None:
        """A connect or disconnect: served before any message, never waits."""
        with self._changed:
            if not self._closed:
                self._control.append(item)
                self._changed.notify_all()

    def get(self, timeout: float | None = None) -> Item | None:
        """A control event if one is queued, else the next sender's oldest message; None once ``timeout``
        passed with nothing queued."""
        with self._changed:
            if not self._changed.wait_for(lambda: bool(self._control or self._turns), timeout):
                return None
            if self._control:
                return self._control.popleft()
            sender = self._turns.popleft()
            queue = self._senders[sender]
            item, size, lane = queue.items.popleft()
            held = queue.held[lane]
            held[0] -= 1
            held[1] -= size
            if queue.items:
                self._turns.append(sender)  # its next message waits for everyone else's turn
            else:
                del self._senders[sender]
            self._bytes -= size
            self._count -= 1
            self._changed.notify_all()
            return item

    def close(self) -> None:
        """The loop stopped: release a waiting network thread (so the connection can close) and take no more."""
        with self._changed:
            self._closed = True
            self._control.clear()
            self._senders.clear()
            self._turns.clear()
            self._bytes = self._count = 0
            self._changed.notify_all()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    @property
    def queued_messages(self) -> int:
        return self._count

    @property
    def senders(self) -> int:
        """Senders with something queued."""
        return len(self._turns)

    @property
    def waiting(self) -> int:
        """Puts waiting for room under the overall budgets (0 or 1: one network thread puts)."""
        return self._waiting
