"""Which cores a bench's processes run on: the receiving side (the coordinator, or the raw baseline's sink) on cores
of its own, the fleet and the broker on the rest, as a deployment separates them (the coordinator's pod has its own
CPU; devices and the broker are elsewhere). Linux only (``os.sched_setaffinity``).

A child inherits the affinity of the thread that starts it, and a thread the affinity of the thread that creates
it: so ``split`` is called before the bench starts any thread or process, and ``spawning_on`` around each start of
a receiving process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class CoreSplit:
    receiver: frozenset[int]
    """The coordinator's cores (the sink's in a raw replay)."""
    senders: frozenset[int]
    """The bench process (the light fleet) and the broker it starts."""

    def describe(self) -> str:
        return (f"the coordinator (and the raw replays' sink) on core {_cores(self.receiver)}, the fleet and the "
                f"broker on core {_cores(self.senders)}")


def split(receiver_cores: int = 1) -> CoreSplit:
    """Give the last ``receiver_cores`` of this process's cores to the receiving side and move the calling thread
    (and so whatever it starts from now on) to the others."""
    cores = sorted(os.sched_getaffinity(0))
    if not 0 < receiver_cores < len(cores):
        raise ValueError(f"pinning needs a core for each side: {len(cores)} usable, {receiver_cores} asked for the "
                         "coordinator")
    chosen = CoreSplit(frozenset(cores[-receiver_cores:]), frozenset(cores[:-receiver_cores]))
    os.sched_setaffinity(0, chosen.senders)
    return chosen


@contextmanager
def spawning_on(cores: frozenset[int] | None) -> Iterator[None]:
    """Processes started inside the block run on ``cores`` (None: where this thread runs): the calling thread moves
    there for the start and back after."""
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _cores(cores: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))
