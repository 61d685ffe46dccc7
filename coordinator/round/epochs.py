"""The run's epoch, and the freshness state that outlives a restart (docs/protocol.md, Freshness).

A signature proves that this coordinator's key wrote a message, not that it belongs to the run
going on now: a run's genuine "finished" status, announcements and global states can be
captured and published again during a later run with the same key. So every message the
coordinator signs carries the run's ``epoch``, and agents drop what an epoch older than the
newest they accepted signed.

The epoch of a new run is the wall clock in milliseconds, or one more than the newest epoch
this state directory ever ran if that is higher (a clock set back): higher than any run this
directory ran, and, clocks being roughly right, than any run a coordinator with the same key
started elsewhere before. A resumed run keeps the epoch in its checkpoint, unless a newer run
has run here since (its checkpoint moved away and this one put back): then, like a checkpoint
that predates epochs, it gets a new one (kept here until the next checkpoint carries it).

The state file ``freshness`` holds the newest epoch (it survives a checkpoint moved away to
start a new run) and the agents' freshness marks (``coordinator.fleet.freshness``), written on
the loop at the start of a run and after every round.
"""

from __future__ import annotations

import logging
from typing import Any

from coordinator.round.actions import Save
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState

log = logging.getLogger("coordinator.round.engine")

FRESHNESS = "freshness"


def new_epoch(wall_clock_s: float, stored: int) -> int:
    """Wall-clock milliseconds, and always above ``stored`` (the newest epoch run before)."""
    return max(int(wall_clock_s * 1000), stored + 1)


def restore(parts: EngineParts, run: RunState, freshness: dict[str, Any] | None,
            checkpoint: dict[str, Any] | None) -> None:
    """Set ``run.epoch`` (``run.run_id`` is set): a new run's, or the resumed run's own."""
    saved = freshness or {}
    parts.registry.load_marks(saved.get("agents") or {})
    stored = int(saved.get("epoch") or 0)
    kept = int(checkpoint.get("epoch") or 0) if checkpoint is not None else 0
    if not kept and checkpoint is not None and saved.get("run_id") == run.run_id:
        kept = stored  # a checkpoint older than epochs, given one at an earlier start
    if kept >= stored and kept:
        run.epoch = kept
        return
    run.epoch = new_epoch(parts.wall_clock(), stored)
    if kept:  # an older run's checkpoint put back after a newer run: agents would drop its old epoch as stale
        log.warning("run %s resumes from a checkpoint of epoch %d, below the %d of run %s since: it runs as epoch %d "
                    "from now on", run.run_id, kept, stored, saved.get("run_id"), run.epoch)
    elif checkpoint is not None:
        log.info("the checkpoint of run %s predates epochs: it runs as epoch %d from now on", run.run_id, run.epoch)
    parts.actions.add(save(parts, run))  # before anything signed with it goes out


def save(parts: EngineParts, run: RunState) -> Save:
    return Save(FRESHNESS, {"epoch": run.epoch, "run_id": run.run_id, "agents": parts.registry.marks()})
