"""Admitting an agent's status: what the engine should record, and what it should count as refused."""

from __future__ import annotations

from coordinator.admission.decisions import Observe, Reject, Remark, StatusDecision
from coordinator.admission.view import AdmissionView
from coordinator.reasons import RejectReason
from protocol.messages import AgentStatus


def admit_status(status: AgentStatus, topic_agent: str, signer: str | None, view: AdmissionView) -> StatusDecision:
    """``signer``: the enrolled agent whose key signed it (None when enrollment is open)."""
    if signer is not None and signer != status.agent_id:
        return Reject(RejectReason.SIGNER_MISMATCH, f"status of {status.agent_id} signed by {signer}'s key")
    if status.agent_id != topic_agent:
        return Reject(RejectReason.TOPIC_MISMATCH, f"status names {status.agent_id}")
    stale = view.agents.stale(status)
    if stale is not None:  # a replay: genuine (signed), but older than what the agent said since
        return Reject(RejectReason.STALE_STATUS, stale)
    refusal = view.agents.refusal(status.agent_id, view.now)
    if refusal is not None:
        return Reject(RejectReason.REGISTRY_FULL, refusal)
    remarks: list[Remark] = []
    problem = view.task.status_problem(status)
    if problem is not None:  # kept (the operator sees it) but never selected; counted at every status
        remarks.append(Remark(Reject(RejectReason.TASK_MISMATCH, problem), "cannot select"))
    if status.label_counts is not None:
        label_problem = view.labels.label_problem(status)
        if label_problem is not None:  # another label space than the run's task
            remarks.append(Remark(Reject(RejectReason.TASK_MISMATCH, label_problem), "ignored the label counts of"))
            status = status.model_copy(update={"label_counts": None})
    return Observe(status, tuple(remarks))
