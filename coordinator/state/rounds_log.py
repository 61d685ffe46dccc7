"""The round history: an append-only JSON-lines file, the only place every round is kept.

The checkpoint holds just what resuming needs (the last round's summary among it), so its
size and write time stay flat however long the run. Nothing on the per-round path reads
this file: a round appends one line; a restart looks only at the file's tail, to drop a line
torn by a crash and to add the last round when the process died between its checkpoint and
its line.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from coordinator.state.rounds import RoundSummary

log = logging.getLogger(__name__)

_TAIL_BYTES = 64 * 1024
"""Enough to hold the last complete line (a summary is well under 1 KB)."""


class RoundsLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, summary: RoundSummary) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(summary.to_dict()) + "\n")

    def reconcile(self, last: RoundSummary | None) -> None:
        """Make the log agree with the checkpoint after a crash: cut a torn last line, append
        ``last`` (the checkpoint's newest round) if the log ends before it."""
        logged = self._repair_tail()
        if last is not None and (logged is None or logged < last.round):
            log.info("rounds.jsonl lacked round %d; appended it from the checkpoint", last.round)
            self.append(last)

    def read(self) -> Iterator[RoundSummary]:
        """Every round, oldest first (for reports and tests; the coordinator never calls it)."""
        if not self.path.exists():
            return
        with self.path.open() as handle:
            for line in handle:
                if line.endswith("\n"):
                    yield RoundSummary.from_dict(json.loads(line))

    def _repair_tail(self) -> int | None:
        """The round of the last complete line (None if there is none), after cutting a torn one."""
        if not self.path.exists():
            return None
        with self.path.open("rb+") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - _TAIL_BYTES)
            handle.seek(start)
            tail = handle.read()
            end = tail.rfind(b"\n") + 1  # bytes of tail up to and including its last newline
            if end < len(tail):
                log.warning("cut a torn line (%d bytes) from the end of %s", len(tail) - end, self.path)
                handle.truncate(start + end)
            lines = tail[:end].splitlines()
        for line in reversed(lines):
            try:
                return int(json.loads(line)["round"])
            except (ValueError, KeyError, TypeError):
                log.warning("ignored an unreadable line in %s", self.path)
        return None
