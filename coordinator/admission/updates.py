"""Admitting an update: a decoded, signature-checked update and a view in, a decision out.

Every policy's decision is framed by the same checks: first that the update is on its own topic
and of this run, then (once the policy accepts it) the weight it may count for (a claim over the
bound is clipped, not rejected), its delta's norm (the engine clips it against the round's median)
and, with KL weighting, its label-skew factor (floored for rare classes' holders:
``telemetry/rare_classes.py``). ``agent_checks``, which every policy composes, lives here too.
"""

from __future__ import annotations

import math
from dataclasses import replace

from coordinator.admission.decisions import Accept, Decision, Reject
from coordinator.admission.view import AdmissionView, UpdatePolicy
from coordinator.aggregation.running_mean import l2_norm
from coordinator.reasons import RejectReason
from protocol.errors import Reason
from protocol.messages import Update
from protocol.topics import ParsedTopic


def admit_update(topic: ParsedTopic, update: Update, view: AdmissionView, policy: UpdatePolicy) -> Decision:
    """The whole admission of one update; changes nothing."""
    problem = run_checks(topic, update, view)
    if problem is not None:
        return problem
    decision = policy.decide(topic, update, view)
    if not isinstance(decision, Accept):
        return decision
    cap = view.sample_cap(update.agent_id)
    if update.num_samples > cap:  # counted for what the coordinator knows it may weigh, not rejected
        decision = replace(decision, samples=cap)
    if update.delta:
        decision = replace(decision, norm=l2_norm(update.delta))
    # Finite float64 values near the limit can have a norm that overflows: no bound scales such a delta and no sum
    # holds it (one such update failed its round for everyone).
    if decision.norm is not None and not math.isfinite(decision.norm):
        return Reject(Reason.NON_FINITE, "its delta's L2 norm overflows float64")
    if update.control_delta and not math.isfinite(l2_norm(update.control_delta)):
        return Reject(Reason.NON_FINITE, "its control_delta's L2 norm overflows float64")
    if view.weighting == "kl" and update.task == "train":
        decision = replace(decision, weight=decision.weight * view.labels.weight_factor(update.agent_id,
                                                                                          view.kl_temperature))
    return decision


def run_checks(topic: ParsedTopic, update: Update, view: AdmissionView) -> Reject | None:
    """The update is on its own topic and of this run."""
    if update.agent_id != topic.agent_id or update.round != topic.round:
        return Reject(RejectReason.TOPIC_MISMATCH,
                      f"update of {update.agent_id}/{update.round} on {topic.agent_id}/{topic.round}")
    if update.run_id != view.run_id:
        return Reject(RejectReason.WRONG_RUN, f"run {update.run_id}, expected {view.run_id}")
    return None


def agent_checks(update: Update, view: AdmissionView) -> Reject | None:
    """The family the agent's status named, and the run's task and layout."""
    family = view.agents.family_of(update.agent_id)
    if family is not None and update.family != family:
        return Reject(RejectReason.WRONG_FAMILY, f"family {update.family}, status says {family}")
    assert view.open_round is not None, "policies check agents of an open round only"
    return view.task.check_update(update, view.open_round.announcement)
