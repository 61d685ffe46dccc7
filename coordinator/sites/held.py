"""Updates a site aggregator holds until it can judge them: their round's announcement or their agent's status
is not heard yet.

That happens after a restart: the site broker delivers what the aggregator's persistent session queued while it
was down (its agents' updates) as soon as it reconnects, possibly before the retained announcement and statuses
its subscriptions bring back. Judged at once, those updates would be refused (wrong run, no open round, unknown
agent) and their agents counted as stragglers although they answered. Held here (decoded and signature-checked
already), they are judged when the round opens or the status arrives, and at the latest when their round closes.
Bounded: beyond the bounds a new one is refused (``deferred_overflow``), never an older one dropped unseen.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.admission.intake import UpdateIn

MAX_HELD_BYTES = 512 * 1024 * 1024


class HeldUpdates:
    def __init__(self, max_count: int, max_bytes: int = MAX_HELD_BYTES) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self._held: dict[tuple[str, int], UpdateIn] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, inbound: UpdateIn) -> bool:
        """Keep it (a resent copy replaces the one held); False when the bounds leave no room."""
        key = (inbound.update.agent_id, inbound.update.round)
        previous = self._held.pop(key, None)
        if previous is not None:
            self._bytes -= previous.size
        if len(self._held) >= self.max_count or self._bytes + inbound.size > self.max_bytes:
            return False
        self._held[key] = inbound
        self._bytes += inbound.size
        return True

    def release(self, ready: Callable[[UpdateIn], bool]) -> list[UpdateIn]:
        """The held updates ``ready`` says can be judged now, in arrival order; no longer held."""
        out = [inbound for inbound in self._held.values() if ready(inbound)]
        for inbound in out:
            del self._held[(inbound.update.agent_id, inbound.update.round)]
            self._bytes -= inbound.size
        return out
