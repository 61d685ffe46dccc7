"""Which global states the coordinator left retained on the broker, kept across restarts.

Each family keeps exactly one retained global state: the one its next round starts from.
Publishing a newer one clears the one it supersedes. The record of what is retained is
written to the state directory, so a coordinator that crashed between publishing and
clearing, or a new run started in the same state directory, still clears what it left.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

RETAINED = "retained"


class RetainedStates:
    def __init__(self) -> None:
        self.on_broker: dict[str, tuple[int, int]] = {}
        """family -> (round, chunks) of the global state retained for it (as far as this coordinator knows);
        a state in n > 1 chunks is retained on n chunk topics."""
        self._sent_this_connection: dict[str, tuple[int, str]] = {}
        self._dirty = False

    def load(self, saved: dict[str, Any] | None) -> None:
        """Resume from the record written by :meth:`unsaved` (state file ``retained``)."""
        if saved is None:
            return
        rounds, chunks = saved.get("rounds"), saved.get("chunks", {})  # "chunks" since 2026-12
        if not isinstance(rounds, dict) or not all(isinstance(r, int) for r in rounds.values()) \
                or not isinstance(chunks, dict) or not all(isinstance(c, int) and c >= 1 for c in chunks.values()):
            log.warning("ignoring the state file %s: not a family -> round map", RETAINED)
            return
        self.on_broker = {str(f): (int(r), int(chunks.get(f, 1))) for f, r in rounds.items()}

    def reconnected(self) -> None:
        """The broker may have lost retained messages: publish everything again."""
        self._sent_this_connection.clear()

    def needs_publishing(self, family: str, round_number: int, digest: str) -> bool:
        return self._sent_this_connection.get(family) != (round_number, digest)

    def published(self, family: str, round_number: int, digest: str, chunks: int = 1) -> list[tuple[int, int]]:
        """Note that ``family``'s state for ``round_number`` is retained now, in ``chunks`` pieces.

        Returns what to clear, as (round, chunks) of :meth:`Topics.global_state_topics`: the state it
        supersedes, or, for the same round republished differently, the topics no longer used. Call
        :meth:`unsaved` once they are cleared: until then the record still names them, so a crash in
        between clears them after the restart.
        """
        self._sent_this_connection[family] = (round_number, digest)
        previous = self.on_broker.get(family)
        if previous == (round_number, chunks):
            return []
        self.on_broker[family] = (round_number, chunks)
        self._dirty = True
        if previous is None:
            return []
        if previous[0] != round_number or (previous[1] > 1) != (chunks > 1):
            return [previous]  # another round, or chunk topics against the plain one: clear all it used
        return [previous] if previous[1] > chunks else []  # fewer chunks now: the caller skips those in use

    def unsaved(self) -> dict[str, Any] | None:
        """The record to write (as state file ``retained``) if it changed since the last call, else None."""
        if not self._dirty:
            return None
        self._dirty = False
        return {"rounds": {f: r for f, (r, _) in self.on_broker.items()},
                "chunks": {f: c for f, (_, c) in self.on_broker.items()}}
