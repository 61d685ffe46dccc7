"""What the engine asks its driver to do: the engine performs no I/O itself (sans-IO, as h11 is for HTTP).

Every input of the engine (a message, a tick, a connection change, a finished background job)
returns the actions it produced, in order; the driver performs them in that order: publishing
on the broker, writing state files, running the round's aggregation off the message loop, and
appending to the rounds log. Tests and a site aggregator drive the same engine with their own driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.round.closure import Closure
from coordinator.state.rounds import RoundSummary


@dataclass(frozen=True)
class Publish:
    topic: str
    payload: bytes
    retain: bool


@dataclass(frozen=True)
class Save:
    """Write ``data`` atomically as state file ``name`` (``CheckpointStore.save``)."""

    name: str
    data: dict[str, Any]
    checkpoint: bool = False
    """The run's checkpoint: the driver reports its size (``fl_checkpoint_bytes``)."""


@dataclass(frozen=True)
class Background:
    """Run ``job`` off the message loop, perform the ``Save`` of the closure it returns, then hand the
    closure to ``RoundEngine.closed``. Until then the engine opens no round."""

    job: Callable[[], Closure]


@dataclass(frozen=True)
class RoundClosed:
    """Append the summary to the rounds log."""

    summary: RoundSummary


@dataclass(frozen=True)
class Resumed:
    """The run was resumed: reconcile the rounds log with the checkpoint's last summary."""

    last: RoundSummary | None


Action = Publish | Save | Background | RoundClosed | Resumed


@dataclass
class Actions:
    """The actions produced by the engine's current input; also the publisher's outbox."""

    pending: list[Action] = field(default_factory=list)

    def publish(self, topic: str, payload: bytes, *, retain: bool) -> None:
        self.pending.append(Publish(topic, payload, retain))

    def add(self, action: Action) -> None:
        self.pending.append(action)

    def drain(self) -> list[Action]:
        taken, self.pending = self.pending, []
        return taken
