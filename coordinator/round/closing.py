"""Closing a round off the message loop: aggregate, summarise, checkpoint.

The engine decides on its loop thread everything that needs the registry or the clock (who
answered, who dropped out, whether the quorum was met), then hands a ``Closure`` to a
background job (a ``Background`` action the driver runs), so that a 35 s Krum over thousands of
updates or a large checkpoint never stops statuses, heartbeats and /healthz from being served. Only the background job
touches the strategy's states and the checkpoint file while a round closes; the loop applies
the result (metrics, logs, publishing) once the job is done.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from coordinator.aggregation import AggregationError
from coordinator.round import epochs
from coordinator.round.actions import Background, RoundClosed, Save
from coordinator.round.applying import release_held
from coordinator.round.broadcast import publish_states, publish_status
from coordinator.round.closure import Closure
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState
from coordinator.round.sites import release_held_sums
from coordinator.state.checkpoint import CHECKPOINT
from coordinator.state.rounds import FamilySummary, RoundSummary
from coordinator.strategies.base import Strategy
from coordinator.telemetry.evaluation import federated_metrics, metrics_by_family

log = logging.getLogger("coordinator.round.engine")


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


def summarise(closure: Closure, cap_multiple: float) -> RoundSummary:
    """The round's summary; timings are completed by the engine once the checkpoint is written.
    ``cap_multiple`` bounds each agent's weight in the evaluation (see telemetry/evaluation.py)."""
    open_round = closure.open_round
    updates = list(open_round.updates.values())
    overall = federated_metrics(updates, cap_multiple)
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
                  for f, m in metrics_by_family(updates, cap_multiple).items()},
        accuracy_median=overall.accuracy_median, accuracy_min=overall.accuracy_min, accuracy_max=overall.accuracy_max,
        detail=closure.detail or (open_round.secure or {}).get("failure"),
        publish_s=round(open_round.publish_s, 4), collect_s=round(closure.collect_s, 4),
        aggregate_s=round(closure.aggregate_s, 4), clipped_claims=sorted(open_round.clipped_claims),
        clipped_norms=sorted(open_round.clipped_norms), sites=dict(open_round.sites), secure=open_round.secure,
    )


def with_checkpoint_time(summary: RoundSummary, checkpoint_s: float) -> RoundSummary:
    """The summary with its checkpoint time, and a duration that includes it."""
    summary.checkpoint_s = round(checkpoint_s, 4)
    summary.duration_s = round(summary.duration_s + checkpoint_s, 3)
    return summary


def begin_close(parts: EngineParts, run: RunState, now: float, ending: tuple[str, str] | None = None) -> Background:
    """Decide on the loop what needs the registry and the clock; the rest is the background job.

    The round stops admitting updates here (later ones are late); the next one opens once the
    job is done and ``finish_close`` applied it.
    """
    open_round = run.open
    assert open_round is not None
    release_held(parts, run)
    release_held_sums(parts, run)
    s = parts.settings
    quorum = open_round.quorum(s.quorum_fraction, s.min_updates)
    outcome, reason = ending or ("completed", None)
    if ending is None and len(open_round.updates) < quorum:
        outcome, reason = "quorum_missed", f"{len(open_round.updates)} of {quorum} needed answered"
    missing = set(open_round.selected) - open_round.updates.keys()
    dropouts = {a for a in missing if a in open_round.went_offline or not parts.registry.is_online(a, now)}
    # Closed early (enough answered): the rest were over-selected, not late. Asynchronous rounds: still working.
    late = now >= open_round.deadline and parts.policy.missing_are_stragglers
    stragglers = (missing - dropouts if late else set()) | (open_round.site_stragglers & missing - dropouts)
    next_round = open_round.number + 1
    closure = Closure(
        open_round=open_round, outcome=outcome, reason=reason, stragglers=stragglers, dropouts=dropouts,
        surplus=missing - dropouts - stragglers, quorum=quorum, population=parts.registry.count_by_family(),
        epsilon_max=parts.privacy.epsilon_max, budget_exhausted=parts.privacy.exhausted, next_round=next_round,
        finished=open_round.announcement.task == "evaluate" or (next_round > s.rounds and not s.evaluate_final),
        closed_at=parts.wall_clock(), collect_s=max(0.0, now - open_round.opened), loop_state=loop_state(parts, run),
    )
    run.open = None
    run.next_round = next_round  # updates for the closing round are now late
    run.closing = True
    return Background(lambda: close_job(parts, run.run_id, closure, run.epoch))


def close_job(parts: EngineParts, run_id: str, closure: Closure, epoch: int) -> Closure:
    """Off the loop: the only code touching the strategy's states meanwhile. Aggregates, summarises and
    prepares the checkpoint the driver writes before the engine applies the closure."""
    strategy = parts.strategy
    aggregate(closure, strategy)
    if strategy.rows is not None:
        closure.spilled_bytes = strategy.rows.spilled_bytes
    strategy.end_round()
    closure.summary = summarise(closure, parts.settings.claim_cap_multiple)
    closure.checkpoint = checkpoint(parts, run_id, closure.next_round, closure.finished, closure.summary,
                                    epoch=epoch, loop=closure.loop_state).data
    return closure


def loop_state(parts: EngineParts, run: RunState) -> dict[str, Any]:
    """On the loop: the agents' highest privacy figures, and the norm medians the next rounds trust (so that a
    restarted coordinator still clips a lone delta, or a lone site's mean, against them)."""
    return {"privacy": parts.privacy.state_dict(),
            "norms": {"updates": run.norm_gate.norms.carried(), "sites": run.site_gate.norms.carried()}}


def checkpoint(parts: EngineParts, run_id: str, next_round: int, finished: bool,
               last_summary: RoundSummary | None, *, epoch: int, loop: dict[str, Any]) -> Save:
    """What resuming needs, and no more: its size does not grow with the run (the rounds log does). ``loop``:
    ``loop_state``, taken on the loop."""
    return Save(CHECKPOINT, {**loop,
        "run_id": run_id, "epoch": epoch, "algorithm": parts.strategy.algorithm, "next_round": next_round,
        "finished": finished, "strategy": parts.strategy.state_dict(), "task": parts.task.state_dict(),
        "versions": parts.versions.state_dict(), "applied": parts.applied.state_dict(),
        "last_summary": None if last_summary is None else last_summary.to_dict(),
        "central_dp": None if parts.central_ledger is None else parts.central_ledger.state_dict(),
    }, checkpoint=True)


def finish_close(parts: EngineParts, run: RunState, closure: Closure) -> None:
    """On the loop, once the job is done and the checkpoint written: metrics, logs, the final states."""
    assert closure.summary is not None
    run.closing = False
    summary = with_checkpoint_time(closure.summary, closure.checkpoint_s)
    m = parts.metrics
    m.aggregation_spilled.set(closure.spilled_bytes)
    if closure.failure is not None:
        log.error("round %d failed to aggregate with %s: %s", summary.round, parts.strategy.aggregator.describe(),
                  closure.failure)
        m.aggregation_failures.labels(closure.failure.reason).inc()
    elif closure.open_round.announcement.task == "train" and closure.outcome == "completed":
        m.aggregation_duration.observe(closure.aggregate_s)
    for drop in closure.dropped:
        parts.rejects.record("update", drop.reason.value, drop.agent_id, drop.detail)
    run.last_summary = summary
    run.finished = closure.finished
    parts.versions.record(parts.strategy.states, run.next_round)  # what the next announcement carries
    m.record_round(summary, finished=run.finished)
    s = parts.settings
    parts.heterogeneity.update(parts.labels, s.kl_temperature if s.weighting == "kl" else None)
    _log_round(summary, closure.stragglers, closure.dropouts)
    parts.actions.add(RoundClosed(summary))
    parts.actions.add(epochs.save(parts, run))  # the agents' freshness marks, for a restart
    if run.finished:
        publish_states(parts, run)  # the final model, for whoever fetches it
        publish_status(parts, run, "finished")
        log.info("run %s finished after round %d", run.run_id, summary.round)


def _log_round(summary: RoundSummary, stragglers: set[str], dropouts: set[str]) -> None:
    acc = "-" if summary.accuracy is None else f"{summary.accuracy:.4f}"
    log.info("round %d %s: %d/%d answered (%d straggling, %d dropped, %d surplus), accuracy %s, %.1fs%s",
             summary.round, summary.outcome, summary.answered, summary.selected, len(stragglers),
             len(dropouts), summary.surplus, acc, summary.duration_s,
             f" ({summary.reason})" if summary.reason else "")
    if stragglers or dropouts:  # a few names help; ten thousand do not
        log.info("round %d missing: straggling %s, dropped %s", summary.round, _some(stragglers), _some(dropouts))


def _some(agents: set[str], shown: int = 20) -> str:
    names = sorted(agents)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
