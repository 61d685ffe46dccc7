"""Applying admission's decisions: the only place where what arrives changes the run.

Admission (``coordinator.admission``) reads a view and decides; these functions, called by the
engine, record an accepted update in the open round, a status in the registry, and count what
was refused.
"""

from __future__ import annotations

import logging
import math

from coordinator.admission.decisions import Accept, Decision, Defer, Forget, Observe, Reject, StatusDecision
from coordinator.admission.intake import Refused, UpdateIn
from coordinator.admission.view import AdmissionView
from coordinator.aggregation.running_mean import l2_norm, with_norm
from coordinator.reasons import RejectReason
from coordinator.round.norm_clip import clip_factor, control_key, held_size, scaled
from coordinator.round.notifying import notify, watch_duplicates
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState
from coordinator.strategies.fedproto import capped_counts
from protocol.messages import AgentStatus, PrivacySpent, Update

log = logging.getLogger("coordinator.round.engine")

MIN_DEFERRED = 64


def admission_view(parts: EngineParts, run: RunState, now: float) -> AdmissionView:
    """What admission may read: references to the run's parts, nothing copied."""
    s = parts.settings
    return AdmissionView(
        run_id=run.run_id, next_round=run.next_round, open_round=run.open, closing=run.closing, now=now,
        agents=parts.registry, task=parts.task, payloads=parts.strategy, versions=parts.versions, applied=parts.applied,
        labels=parts.labels, enrolled=parts.enrollment, max_samples=s.max_samples_per_update,
        claim_cap_multiple=s.claim_cap_multiple, weighting=s.weighting, kl_temperature=s.kl_temperature)


def apply_status(parts: EngineParts, run: RunState, agent_id: str, status: AgentStatus, decision: StatusDecision,
                 now: float) -> None:
    """``status`` as it arrived (``agent_id``: its topic's); ``decision`` what admission made of it."""
    if isinstance(decision, Forget):
        forget(parts, decision.agent_id)
        return
    if isinstance(decision, Reject):
        parts.rejects.record("agent_status", decision.reason.value, agent_id, decision.detail)
        if decision.reason == RejectReason.STALE_STATUS:  # a replay, or a second live process under this id
            watch_duplicates(parts, run, status)
        else:
            notify(parts, run, agent_id, "status", decision)
        return
    watch_duplicates(parts, run, status)
    for remark in decision.remarks:
        parts.rejects.record("agent_status", remark.reject.reason.value, agent_id, remark.reject.detail, remark.action)
        notify(parts, run, agent_id, "status", remark.reject)
    _observe(parts, run, decision, now)


def _observe(parts: EngineParts, run: RunState, decision: Observe, now: float) -> None:
    status = decision.status
    if status.label_counts is not None and parts.task.card.kind != "classification":
        status = status.model_copy(update={"label_counts": None})  # a regression task has no label space
    parts.labels.observe_status(status)  # no label counts: forgets the ones it sent before
    if status.label_counts is not None:  # kept by the label index only: the registry holds many statuses
        status = status.model_copy(update={"label_counts": None})
    previous = parts.registry.get(status.agent_id)
    seen = parts.registry.observe(status, now)
    if seen.evicted is not None:
        let_go(parts, seen.evicted)
    m = parts.metrics
    device = m.device_label(status.device)
    if seen.restarted:
        m.agent_restarts.labels(device).inc()
    if seen.new_reconnects:
        m.agent_reconnects.labels(device).inc(seen.new_reconnects)
    if status.state == "offline" and run.open is not None and status.agent_id in run.open.selected_set:
        run.open.went_offline.add(status.agent_id)
    if status.state != "offline":  # a last will is written when the agent connects: its figure may be that old
        _privacy_reported(parts, status.agent_id, status.device, status.privacy, now)
    if (previous is None or previous.status.state != status.state) and parts.state_log.allow(status.agent_id, "state",
                                                                                             now):
        spent = f", epsilon {status.privacy.epsilon:.4g}" if status.privacy is not None else ""
        log.info("agent %s (%s, %s, %d samples) is %s%s", status.agent_id, status.device, status.family,
                 status.num_samples, status.state, spent)


def forget(parts: EngineParts, agent_id: str) -> None:
    """A cleared retained status (decommissioned), or silent past ``forget_agents_after_s``."""
    parts.registry.forget(agent_id)
    let_go(parts, agent_id)


def let_go(parts: EngineParts, agent_id: str) -> None:
    """What is kept per agent beside the registry, for one the registry no longer holds (forgotten or evicted):
    without this a sender cycling through fresh ids would grow them past the registry's cap."""
    parts.privacy.forget(agent_id)
    parts.labels.forget(agent_id)
    parts.rosters.forget(agent_id)


def apply_update(parts: EngineParts, run: RunState, inbound: UpdateIn, decision: Decision) -> None:
    if isinstance(decision, Accept):
        _accept(parts, run, inbound, decision)
    elif isinstance(decision, Defer):
        agent_id = inbound.update.agent_id
        waiting = next((i for i, w in enumerate(run.deferred) if w.update.agent_id == agent_id), None)
        if waiting is not None and inbound.update.round > run.deferred[waiting].update.round:
            older = run.deferred[waiting].update.round  # its newer work waits instead: the older would be refused
            run.deferred[waiting] = inbound  # once this is applied; it is refused (and counted) now
            refuse_update(parts, run, agent_id, Reject(
                RejectReason.DEFERRED_OVERFLOW, f"its update of version {older} waited; one of version "
                                                f"{inbound.update.round} takes its place"))
            return
        if waiting is not None:
            # One waits per agent: its updates are checked only once they are taken, so more would let one
            # agent fill the queue with junk and crowd out everyone else's.
            refuse_update(parts, run, agent_id, Reject(
                RejectReason.DEFERRED_OVERFLOW, f"an update of {agent_id} already waits"))
            return
        if len(run.deferred) >= max(MIN_DEFERRED, 2 * parts.settings.buffer_size):
            refuse_update(parts, run, agent_id, Reject(
                RejectReason.DEFERRED_OVERFLOW, f"{len(run.deferred)} updates already wait"))
            return
        run.deferred.append(inbound)
        parts.metrics.deferred.inc()
    else:
        refuse_update(parts, run, inbound.update.agent_id, decision)
        notify(parts, run, inbound.update.agent_id, "update", decision, inbound.update.round)


def _accept(parts: EngineParts, run: RunState, inbound: UpdateIn, accept: Accept) -> None:
    assert run.open is not None, "admission accepts updates of an open round only"
    update, m = inbound.update, parts.metrics
    if accept.samples is not None:
        update = _claiming(update, accept.samples)
        run.open.clipped_claims.append(update.agent_id)
        m.updates_clipped.labels("claim").inc()
    if update.task == "train":
        m.staleness.observe(accept.staleness)
        parts.applied.record(update.agent_id, update.round)
    residual = update.metrics.extra.get("ef_residual_norm")
    if residual is not None and math.isfinite(residual) and residual >= 0 and run.open.announcement.compression != "none":
        m.residual_norm.set(residual)  # the agent's own word, for a gauge: at least a norm, and of a run that compresses
    run.open.bytes_in += inbound.size
    m.updates.labels("accepted").inc()
    run.open.updates[update.agent_id] = update  # answered; replaced by what the strategy keeps once folded
    if accept.norm is not None and update.control_delta:  # SCAFFOLD: control deltas get a median of their own
        update = update.model_copy(update={"control_delta": with_norm(update.control_delta)})  # taken once
        run.norm_gate.norms.observe(control_key(update.family), l2_norm(update.control_delta))
    if accept.norm is None:
        _fold(parts, run, update, accept.weight)
    else:  # deltas are clipped against the round's median norm, once there is one
        for (held, weight), bound in run.norm_gate.admit(update.family, (update, accept.weight), accept.norm,
                                                           held_size(update)):
            _fold(parts, run, held, weight, bound)
    record = parts.registry.get(update.agent_id)
    _privacy_reported(parts, update.agent_id, record.status.device if record else "other", update.privacy,
                      parts.clock())
    if update.privacy is not None and update.privacy.exhausted:
        parts.registry.budget_spent(update.agent_id, update.privacy)


def _privacy_reported(parts: EngineParts, agent_id: str, device: str, spent: PrivacySpent | None, now: float) -> None:
    """Count what the agent spent; one whose ledger went back is not selected to train (as if spent) until it
    reports at least the highest figure again."""
    highest = parts.privacy.observe(agent_id, device, spent)
    if highest is None or spent is None:
        return
    parts.registry.budget_spent(agent_id, spent.model_copy(update={"epsilon": highest, "exhausted": True}))
    if parts.state_log.allow(agent_id, "privacy_rollback", now):
        log.warning("agent %s reports epsilon %.6g, below the %.6g it reported before: its privacy ledger went back "
                    "(a restored or wiped state directory?); not selected to train until it reports %.6g again",
                    agent_id, spent.epsilon, highest, highest)


def _fold(parts: EngineParts, run: RunState, update: Update, weight: float, bound: float | None = None) -> None:
    assert run.open is not None
    factors: dict[str, float] = {}
    if bound is not None:
        control_bound = run.norm_gate.norms.bound(control_key(update.family)) if update.control_delta else None
        factors = {"delta": clip_factor(l2_norm(update.delta), bound),
                   "control_delta": clip_factor(l2_norm(update.control_delta), control_bound)}
        if any(f != 1.0 for f in factors.values()):
            run.open.clipped_norms.append(update.agent_id)
            parts.metrics.updates_clipped.labels("norm").inc()
        else:
            factors = {}
    if factors and (not parts.strategy.folding or update.weights):  # stored (rows, a proposal): a scaled copy
        update = update.model_copy(update={name: scaled(getattr(update, name), f) for name, f in factors.items()})
        factors = {}
    run.open.updates[update.agent_id] = parts.strategy.accumulate(update, weight, factors or None)


def release_held(parts: EngineParts, run: RunState) -> None:
    """The round closes: fold the deltas still held for want of a median (fewer than HOLD arrived)."""
    for (update, weight), bound in run.norm_gate.release():
        _fold(parts, run, update, weight, bound)


def _claiming(update: Update, samples: int) -> Update:
    """``update`` counted for ``samples``: FedProto's per-class counts scaled down alike."""
    changes: dict[str, object] = {"num_samples": samples}
    if update.prototype_counts is not None:
        changes["prototype_counts"] = capped_counts(update.prototype_counts, samples, update.num_samples)
    return update.model_copy(update=changes)


def refused(parts: EngineParts, run: RunState, refusal: Refused) -> None:
    """A message intake could not read or trust."""
    if refusal.kind == "update":
        refuse_update(parts, run, refusal.sender, refusal.reject)
    else:
        parts.rejects.record(refusal.kind, refusal.reject.reason.value, refusal.sender, refusal.reject.detail)


def refuse_update(parts: EngineParts, run: RunState, sender: str, reject: Reject) -> None:
    if run.open is not None:
        run.open.rejected += 1
    parts.metrics.updates.labels("rejected").inc()
    parts.rejects.record("update", reject.reason.value, sender, reject.detail)
