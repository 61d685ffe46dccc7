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
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from coordinator.state.rounds import RoundSummary

log = logging.getLogger(__name__)

_CHUNK_BYTES = 64 * 1024
"""The tail is read backwards in pieces of this size: a summary is about 1 KB, but one naming agents (clipped claims,
a secure round's accounts) of a 10,000-agent round is far longer."""


class RoundsLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, summary: RoundSummary) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(_finite(summary.to_dict()), allow_nan=False) + "\n")

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
            end = _after_last_newline(handle, size)
            if end < size:
                log.warning("cut a torn line (%d bytes) from the end of %s", size - end, self.path)
                handle.truncate(end)
            for line in _lines_backwards(handle, end):
                try:
                    return int(json.loads(line)["round"])
                except (ValueError, KeyError, TypeError, OverflowError):
                    log.warning("ignored an unreadable line in %s", self.path)
        return None


def _after_last_newline(handle: BinaryIO, size: int) -> int:
    """The offset just past the file's last newline (0 if it has none): where a torn last line starts."""
    position = size
    while position > 0:
        start = max(0, position - _CHUNK_BYTES)
        handle.seek(start)
        at = handle.read(position - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        position = start
    return 0


def _lines_backwards(handle: BinaryIO, end: int) -> Iterator[bytes]:
    """The non-empty lines before ``end`` (just past a newline), last first, read a chunk at a time."""
    pending, position = b"", end
    while position > 0:
        start = max(0, position - _CHUNK_BYTES)
        handle.seek(start)
        pieces = (handle.read(position - start) + pending).split(b"\n")
        position, pending = start, pieces[0]  # the first piece may begin in an earlier chunk
        yield from (line for line in reversed(pieces[1:]) if line)
    if pending:
        yield pending


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None: a line is standard JSON (no Infinity or NaN tokens)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value
