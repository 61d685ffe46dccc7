"""Closing a round off the message loop: aggregate, summarise, checkpoint.

The engine decides on its loop thread everything that needs the registry or the clock (who
answered, who dropped out, whether the quorum was met), then hands a ``Closure`` to a
background executor, so that a 35 s Krum over thousands of updates or a large checkpoint
never stops statuses, heartbeats and /healthz from being served. Only the background job
touches the strategy's states and the checkpoint file while a round closes; the loop applies
the result (metrics, logs, publishing) once the job is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from coordinator.aggregation import AggregationError
from coordinator.state.rounds import FamilySummary, OpenRound, RoundSummary
from coordinator.strategies.base import Dropped, Strategy
from coordinator.telemetry.evaluation import federated_metrics, metrics_by_family

T = TypeVar("T")


class InlineExecutor(Executor):
    """Runs each job at once on the caller's thread (engine unit tests, with a fake clock)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to whoever reads the result, like a thread pool would
            future.set_exception(exc)
        return future


@dataclass
class Closure:
    """What the loop decided about a round as it closed; the rest is done in the background."""

    open_round: OpenRound
    outcome: str
    """completed (if aggregation succeeds) | quorum_missed | interrupted"""
    reason: str | None
    stragglers: set[str]
    dropouts: set[str]
    surplus: set[str]
    quorum: int
    population: Mapping[str, int]
    epsilon_max: float | None
    budget_exhausted: int
    next_round: int
    finished: bool
    closed_at: float
    """Wall clock."""
    collect_s: float
    detail: str | None = None
    dropped: list[Dropped] = field(default_factory=list)
    failure: AggregationError | None = None
    aggregate_s: float = 0.0
    checkpoint_s: float = 0.0
    checkpoint_bytes: int = 0
    spilled_bytes: int = 0
    """Bytes of updates a robust rule kept in a memory-mapped file (past the memory budget)."""
    summary: RoundSummary | None = None


def aggregate(closure: Closure, strategy: Strategy) -> None:
    """Aggregate a training round that met its quorum; a rule's failure fails the round, nothing else."""
    open_round = closure.open_round
    if closure.outcome != "completed" or open_round.announcement.task != "train":
        return
    started = time.perf_counter()
    try:
        closure.dropped = strategy.aggregate(open_round.number, list(open_round.updates.values()),
                                             population=closure.population)
    except AggregationError as exc:
        closure.outcome, closure.reason, closure.detail, closure.failure = "failed", exc.reason, exc.detail, exc
    closure.aggregate_s = time.perf_counter() - started


def summarise(closure: Closure) -> RoundSummary:
    """The round's summary; timings are completed by the engine once the checkpoint is written."""
    open_round = closure.open_round
    updates = open_round.updates.values()
    overall = federated_metrics(updates)
    answered_by_family: dict[str, int] = {}
    for update in updates:
        answered_by_family[update.family] = answered_by_family.get(update.family, 0) + 1
    return RoundSummary(
        round=open_round.number, task=open_round.announcement.task, outcome=closure.outcome, reason=closure.reason,
        selected=len(open_round.selected), answered=len(open_round.updates), stragglers=len(closure.stragglers),
        dropouts=len(closure.dropouts), surplus=len(closure.surplus),
        rejected=open_round.rejected + len(closure.dropped), quorum=closure.quorum,
        duration_s=round(open_round.publish_s + closure.collect_s + closure.aggregate_s, 3),
        deadline_s=open_round.announcement.deadline_s, bytes_in=open_round.bytes_in, bytes_out=open_round.bytes_out,
        accuracy=overall.accuracy, loss=overall.loss, train_loss=overall.train_loss, closed_at=closure.closed_at,
        epsilon_max=closure.epsilon_max, budget_exhausted=closure.budget_exhausted,
        families={f: FamilySummary(answered_by_family[f], m.accuracy, m.loss)
                  for f, m in metrics_by_family(updates).items()},
        detail=closure.detail, publish_s=round(open_round.publish_s, 4), collect_s=round(closure.collect_s, 4),
        aggregate_s=round(closure.aggregate_s, 4),
    )


def with_checkpoint_time(summary: RoundSummary, checkpoint_s: float) -> RoundSummary:
    """The summary with its checkpoint time, and a duration that includes it."""
    summary.checkpoint_s = round(checkpoint_s, 4)
    summary.duration_s = round(summary.duration_s + checkpoint_s, 3)
    return summary
