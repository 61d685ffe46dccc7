"""Drives a RoundEngine: feeds it events and performs the actions it returns.

The service drives it with the MQTT link as its outbox and a thread for the closing rounds'
aggregation; the engine's tests drive it with a recording outbox and ``InlineExecutor`` (the
job runs at once, on the caller's thread), so they need no broker and no threads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from typing import Any, Protocol, TypeVar

from coordinator.admission.intake import Opened
from coordinator.round.actions import Action, Background, Publish, Resumed, RoundClosed, Save
from coordinator.round.closure import Closure
from coordinator.round.engine import RoundEngine
from coordinator.round.epochs import FRESHNESS
from coordinator.round.opening import OPEN_ROUND
from coordinator.round.resume import Saved
from coordinator.state.checkpoint import CHECKPOINT, CheckpointError, CheckpointStore
from coordinator.state.retained import RETAINED
from coordinator.state.rounds import RoundSummary
from protocol.errors import ProtocolError

log = logging.getLogger(__name__)

T = TypeVar("T")


class Outbox(Protocol):
    def publish(self, topic: str, payload: bytes, *, retain: bool) -> None: ...


class InlineExecutor(Executor):
    """Runs each job at once on the caller's thread (engine unit tests, with a fake clock)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to whoever reads the result, like a thread pool would
            future.set_exception(exc)
        return future


class EngineDriver:
    def __init__(self, engine: RoundEngine, outbox: Outbox, store: CheckpointStore, *,
                 background: Executor | None = None,
                 on_round_closed: Callable[[RoundSummary], None] | None = None,
                 on_resumed: Callable[[RoundSummary | None], None] | None = None,
                 on_job_done: Callable[[], None] | None = None) -> None:
        """``on_job_done``: called on the job's thread when a closing job finishes, so that a caller waiting for
        input wakes and applies it at once instead of at its next poll."""
        self.engine = engine
        self.outbox = outbox
        self.store = store
        self.background = background or InlineExecutor()
        self.on_round_closed = on_round_closed
        self.on_resumed = on_resumed
        self.on_job_done = on_job_done
        self._closing: Future[Closure] | None = None

    @property
    def closing_job(self) -> Future[Closure] | None:
        """The closing round's background job while it runs (the next tick applies it once done)."""
        return self._closing

    # -- events in ------------------------------------------------------------------------
    def restore(self) -> None:
        self.store.remove_torn_writes()  # this process writes here from now on
        saved = Saved(self.store.load(CHECKPOINT), self.store.load(OPEN_ROUND), self.store.load(RETAINED),
                      str(self.store.directory), self.store.load(FRESHNESS))
        try:
            actions = self.engine.restore(saved)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError, ProtocolError) as exc:
            # A file that decodes but was damaged or edited: stop, naming where, rather than start over or crash bare.
            raise CheckpointError(f"the state in {self.store.directory} (checkpoint, open_round, retained, "
                                  f"freshness) cannot be resumed: {type(exc).__name__}: {exc}; move the damaged "
                                  f"file away, or the directory to start a new run") from exc
        self.perform(actions)

    def on_message(self, topic: str, payload: bytes, opened: Opened | None = None) -> None:
        """``opened``: the update ``payload`` carries, already opened off the loop (app/openers.py)."""
        if opened is not None:
            self.engine.parts.intake.hand(opened)
        self.perform(self.engine.on_message(topic, payload))

    def on_connection(self, connected: bool, session_present: bool = True) -> None:
        self.perform(self.engine.on_connection(connected, session_present))

    def tick(self) -> float:
        """Apply a finished closing job, then tick; how long the caller may wait for input."""
        if self._closing is not None:
            if not self._closing.done():
                return 0.05
            future, self._closing = self._closing, None
            # Anything but an AggregationError (which fails the round inside the job) is a bug: let it stop the process.
            self.perform(self.engine.closed(future.result()))
            return 0.0
        tick = self.engine.tick()
        self.perform(tick.actions)
        return 0.0 if self._closing is not None and self._closing.done() else tick.wait_s

    def _job_done(self, _: Future[Closure]) -> None:
        assert self.on_job_done is not None
        self.on_job_done()

    # -- actions out ----------------------------------------------------------------------
    def perform(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, Publish):
                self.outbox.publish(action.topic, action.payload, retain=action.retain)
            elif isinstance(action, Save):
                self._save(action)
            elif isinstance(action, Background):
                assert self._closing is None, "one round closes at a time"
                self._closing = self.background.submit(self._close, action)
                if self._closing.done():  # inline: apply at once, as the next tick would
                    future, self._closing = self._closing, None
                    self.perform(self.engine.closed(future.result()))
                elif self.on_job_done is not None:
                    self._closing.add_done_callback(self._job_done)
            elif isinstance(action, RoundClosed):
                if self.on_round_closed is not None:
                    self.on_round_closed(action.summary)
            elif isinstance(action, Resumed):
                if self.on_resumed is not None:
                    self.on_resumed(action.last)

    def _save(self, action: Save) -> int:
        size = self.store.save(action.name, action.data)
        if action.checkpoint:
            self.engine.parts.metrics.checkpointed(size)
        return size

    def _close(self, action: Background) -> Closure:
        """Off the loop: the round's job, then its checkpoint, before the engine sees the closure."""
        closure = action.job()
        if closure.checkpoint is not None:
            started = time.perf_counter()
            closure.checkpoint_bytes = self._save(Save(CHECKPOINT, closure.checkpoint, checkpoint=True))
            closure.checkpoint_s = time.perf_counter() - started
        return closure

    def __getattr__(self, name: str) -> Any:
        """Reads of the run (``open``, ``last_summary``, ``strategy``, ...) go to the engine."""
        return getattr(self.engine, name)
