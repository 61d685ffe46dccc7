"""Opening a round: who is available, whom to select, the announcement, and publishing it."""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter

from coordinator.admission.decisions import Reject
from coordinator.admission.task_agreement import fingerprint_of
from coordinator.admission.view import median_cap
from coordinator.fleet.agents import AgentRecord
from coordinator.fleet.selection import plan_selection
from coordinator.fleet.waiting import not_available
from coordinator.reasons import RejectReason
from coordinator.round.actions import Save
from coordinator.round.applying import admission_view
from coordinator.round.broadcast import publish_states, publish_status
from coordinator.round.norm_clip import NormGate, RoundNorms, norm_scales
from coordinator.round.notifying import notify
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState
from coordinator.schedule import round_learning_rate
from coordinator.state.rounds import OpenRound
from protocol.messages import LocalTraining, RoundAnnouncement, StateRef
from protocol.wire import encode_message

log = logging.getLogger("coordinator.round.engine")

OPEN_ROUND = "open_round"
WAIT_LOG_EVERY_S = 10.0


def open_round_record(run_id: str, open_round: OpenRound, *, unmasking: bool = False) -> Save:
    """The state file a restart resumes the open round from (``resume._resume_open_round``); ``unmasking``: a noisy
    secure round is about to ask for the reveals, so a restart charges its release (``resume``)."""
    return Save(OPEN_ROUND, {"run_id": run_id, "round": open_round.number,
                             "announcement": encode_message(open_round.announcement), "wanted": open_round.wanted,
                             "median_claim": open_round.median_claim, "unmasking": unmasking})


def maybe_open(parts: EngineParts, run: RunState, now: float) -> bool:
    """Open round ``run.next_round`` if connected and enough agents are selectable; whether it opened."""
    s = parts.settings
    number = run.next_round
    task = "train" if number <= s.rounds else "evaluate"
    ready = parts.registry.available_count(now) if task == "train" else parts.registry.evaluable_count(now)
    if not run.connected or ready < s.min_available_agents:
        # Too few whatever their statuses say. The scans below cost O(agents) and this runs after every
        # message: a fleet of 4,000 coming online spent 9 s in them before round 1 (O(agents^2)).
        _log_waiting(parts, run, now, task, None)
        return False
    pool = parts.registry.available(now) if task == "train" else parts.registry.evaluable(now)
    ref = parts.task.card.ref
    willing = [r for r in pool if r.status.problem is None and r.status.task_ref == ref]
    if len(willing) >= s.min_available_agents:  # a quorum's majority, never the first hello
        revision = parts.task.revision
        parts.task.pin((r.status for r in willing), {f: st.weights for f, st in parts.strategy.states.items()})
        if parts.task.revision != revision:
            _tell_the_minority(parts, run, willing)
    # Selectable: of the task, and of a family whose layout is agreed (not yet agreed is a wait, not a mismatch).
    pool = [r for r in pool if parts.task.status_problem(r.status) is None and r.status.family in parts.task.layouts]
    available = [r.agent_id for r in pool]
    if len(available) < s.min_available_agents:
        if len(willing) < s.min_available_agents:  # layouts wait for a quorum: count who would take part
            available = [r.agent_id for r in willing]
        _log_waiting(parts, run, now, task, available)
        return False
    fraction, minimum, over = parts.policy.selection(task, s.fraction_fit, s.min_fit_agents, s.over_selection)
    plan = plan_selection(available, number, seed=s.seed, fraction=fraction, minimum=minimum,
                          over_selection=over, maximum=s.max_agents_per_round)
    selected, wanted = plan.selected, parts.policy.wanted(task, plan.wanted)
    if len(selected) < min(len(available), math.ceil(fraction * len(available))):
        log.warning("round %d: %d agents available, selecting %d (max_agents_per_round)",
                    number, len(available), len(selected))
    chosen = set(selected)  # once: the pool may hold 50,000 agents and a round select 10,000
    families = {r.status.family for r in pool if r.agent_id in chosen}
    announcement = announce(parts, run, number, task, selected, families)
    claims = [r.status.num_samples for r in pool if r.agent_id in chosen]
    median_claim = float(statistics.median_low(claims)) if claims else None  # of two claims, the lower
    if median_claim is not None and s.claim_cap_multiple > 0:  # what sites must cap their agents at too
        announcement = announcement.model_copy(update={"claim_cap": median_cap(median_claim, s.claim_cap_multiple,
                                                                               s.max_samples_per_update)})
    if parts.secure is not None:  # a secure round declares its sessions (coordinator/round/secure.py), capped as above
        announcement = parts.secure.plan(parts, announcement, {r.agent_id: r for r in pool if r.agent_id in chosen})
    plain = encode_message(announcement)
    payload = parts.publisher.sealed(plain)
    run.open = OpenRound(announcement, payload, now + s.round_deadline_s, now, wanted, median_claim=median_claim)
    parts.actions.add(open_round_record(run.run_id, run.open))
    begin(parts, run)
    if parts.secure is not None:
        parts.secure.begin(parts, run)
    started = time.perf_counter()
    run.open.bytes_out += publish_states(parts, run)
    run.open.bytes_out += parts.publisher.publish(parts.topics.rounds_current, payload, "round", retain=True)
    publish_status(parts, run, "online")
    run.open.publish_s = time.perf_counter() - started
    m = parts.metrics
    m.current_round.set(number)
    m.round_deadline.set(s.round_deadline_s)
    m.round_learning_rate.set(announcement.training.learning_rate)
    m.agents_selected.inc(len(selected))
    m.round_quorum.set(run.open.quorum(s.quorum_fraction, s.min_updates))
    m.progressed(parts.wall_clock())
    log.info("round %d (%s): selected %d of %d agents (%d wanted), deadline %.0fs",
             number, task, len(selected), len(available), wanted, s.round_deadline_s)
    return True


def _log_waiting(parts: EngineParts, run: RunState, now: float, task: str, available: list[str] | None) -> None:
    """At most every ``WAIT_LOG_EVERY_S``: how many agents are ready, of how many needed, and why the others are
    not. ``available``: the ready ids, or None for the registry's available agents (read only when logging)."""
    if now - run.last_wait_log <= WAIT_LOG_EVERY_S:
        return
    if available is None:
        ready = parts.registry.available(now) if task == "train" else parts.registry.evaluable(now)
        available = [r.agent_id for r in ready]
    spent = parts.registry.budget_spent_count(now) if task == "train" else 0
    enrolled = parts.enrollment.agent_ids() if parts.enrollment is not None else ()
    log.info("waiting for agents: %d online, %d needed%s%s", len(available), parts.settings.min_available_agents,
             f" ({spent} more have spent their privacy budget and train no more)" if spent else "",
             not_available(parts.registry, enrolled, available, now))
    run.last_wait_log = now


def _tell_the_minority(parts: EngineParts, run: RunState, willing: list[AgentRecord]) -> None:
    """Agents whose layout lost the vote hear it now, not at their next heartbeat."""
    for record in willing:
        problem = parts.task.status_problem(record.status)
        if problem is not None:
            notify(parts, run, record.agent_id, "status", Reject(RejectReason.TASK_MISMATCH, problem))


def announce(parts: EngineParts, run: RunState, number: int, task: str, selected: list[str],
             families: set[str]) -> RoundAnnouncement:
    s = parts.settings
    learning_rate = round_learning_rate(s.learning_rate, s.learning_rate_decay, number)
    return RoundAnnouncement(
        run_id=run.run_id, round=number, task=task, task_ref=parts.task.card.ref,
        layouts={f: parts.task.layouts[f] for f in sorted(families)}, algorithm=parts.strategy.algorithm,
        training=LocalTraining(epochs=s.local_epochs, learning_rate=learning_rate, momentum=s.momentum,
                               weight_decay=s.weight_decay, batch_size=s.batch_size, steps=s.local_steps),
        params=parts.strategy.round_params(number), selected=selected,
        states={f: StateRef(family=f, round=st.round, digest=st.digest) for f, st in parts.strategy.states.items()},
        init_seed=s.init_seed, issued_at=parts.wall_clock(), deadline_s=s.round_deadline_s, last_round=s.rounds,
        compression=s.compression if task == "train" else "none", epoch=run.epoch,
        control_layouts={f: fingerprint_of(st.control) for f, st in parts.strategy.states.items()
                         if st.control},
    )


def begin(parts: EngineParts, run: RunState) -> None:
    """The strategy's accumulators for a round of at most this many updates (rows spill past the budget),
    and the round's own norm statistics (the gate holds each family's first deltas until its cohort came, within a
    budget of the same size for all families together: ``norm_clip.py``)."""
    assert run.open is not None
    behind = parts.rosters.site_of  # agents behind site aggregators: their deltas come in their sites' sums
    family_of = {agent_id: record.status.family if (record := parts.registry.get(agent_id)) is not None else None
                 for agent_id in run.open.selected}
    families = [family for agent_id, family in family_of.items() if agent_id not in behind]
    cohorts = Counter(family for family in families if family is not None)
    selected: dict[str, set[str]] = {}  # every selected agent by family, behind sites too: who votes on a first state
    for agent_id, family in family_of.items():
        if family is not None:
            selected.setdefault(family, set()).add(agent_id)
    parts.strategy.begin_round(len(run.open.selected),
                               memory_budget_bytes=parts.settings.aggregation_memory_mb * 1024**2,
                               spill_dir=parts.settings.state_dir / "spill", voters=selected)
    scales, sizes = norm_scales({f: st.weights for f, st in parts.strategy.states.items()},
                                {f: st.control for f, st in parts.strategy.states.items()})
    run.norm_gate = NormGate(RoundNorms(parts.settings.max_norm_ratio, run.norm_gate.norms.carried(), scales, sizes),
                             cohorts, hold_bytes=parts.settings.aggregation_memory_mb * 1024**2,
                             others=families.count(None))
    run.site_gate = NormGate(RoundNorms(parts.settings.max_norm_ratio, run.site_gate.norms.carried()))
    run.pending_sums = []
    # A status's label histogram counts for no more samples than the agent's updates may (the round's claim cap).
    parts.labels.set_caps(admission_view(parts, run, parts.clock()).sample_cap)
