"""Which global states the coordinator left retained on the broker, kept across restarts.

Each family keeps exactly one retained global state: the one its next round starts from.
Publishing a newer one clears the one it supersedes. The record of what is retained is
written to the state directory, so a coordinator that crashed between publishing and
clearing, or a new run started in the same state directory, still clears what it left.
"""

from __future__ import annotations

import logging

from coordinator.checkpoint import CheckpointStore

log = logging.getLogger(__name__)

RETAINED = "retained"


class RetainedStates:
    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.on_broker: dict[str, int] = {}
        """family -> round of the global state retained for it (as far as this coordinator knows)."""
        self._sent_this_connection: dict[str, tuple[int, str]] = {}
        self._dirty = False

    def load(self) -> None:
        saved = self.store.load(RETAINED)
        if saved is None:
            return
        rounds = saved.get("rounds")
        if not isinstance(rounds, dict) or not all(isinstance(r, int) for r in rounds.values()):
            log.warning("ignoring %s: not a family -> round map", self.store.path(RETAINED))
            return
        self.on_broker = {str(f): int(r) for f, r in rounds.items()}

    def reconnected(self) -> None:
        """The broker may have lost retained messages: publish everything again."""
        self._sent_this_connection.clear()

    def needs_publishing(self, family: str, round_number: int, digest: str) -> bool:
        return self._sent_this_connection.get(family) != (round_number, digest)

    def published(self, family: str, round_number: int, digest: str) -> int | None:
        """Note that ``family``'s state for ``round_number`` is retained now; returns the round to clear.

        Call :meth:`save` once the superseded states are cleared: until then the record still
        names them, so a crash in between clears them after the restart.
        """
        self._sent_this_connection[family] = (round_number, digest)
        previous = self.on_broker.get(family)
        if previous == round_number:
            return None
        self.on_broker[family] = round_number
        self._dirty = True
        return previous

    def save(self) -> None:
        if self._dirty:
            self.store.save(RETAINED, {"rounds": dict(self.on_broker)})
            self._dirty = False
