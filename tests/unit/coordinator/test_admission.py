"""Admission on its own: a view built by hand, an update or a status in, a decision out, nothing changed.

This is what lets a site aggregator (or anything else) admit updates without a round engine.
"""

from __future__ import annotations

import numpy as np

from coordinator.admission.decisions import Accept, Defer, Observe, Reject
from coordinator.admission.statuses import admit_status
from coordinator.admission.task_agreement import TaskAgreement
from coordinator.admission.updates import admit_update
from coordinator.admission.view import AdmissionView
from coordinator.aggregation import weighted_mean
from coordinator.fleet.agents import AgentRegistry
from coordinator.policies import FedBuffPolicy, SynchronousPolicy
from coordinator.state.applied import AppliedVersions
from coordinator.state.rounds import OpenRound
from coordinator.state.versions import VersionLog
from coordinator.strategies import FedAvg
from coordinator.telemetry.heterogeneity import LabelSkew
from protocol.messages import AgentStatus, LocalTraining, RoundAnnouncement, TrainMetrics, Update
from protocol.tasks import load_task_card
from protocol.topics import ParsedTopic
from tests.task_refs import DIGITS, layout

WEIGHTS = {"w": np.ones((2, 3), np.float32)}
LAYOUT = layout(WEIGHTS)


class Caps:
    def __init__(self, caps: dict[str, int]) -> None:
        self.caps = caps

    def max_samples_of(self, agent_id: str) -> int | None:
        return self.caps.get(agent_id)


def status(agent_id: str, **fields: object) -> AgentStatus:
    values: dict[str, object] = {"agent_id": agent_id, "state": "online", "device": "rpi", "family": "f",
                                 "num_samples": 10, "num_eval_samples": 2, "version": "t", "timestamp": 0.0,
                                 "task_ref": DIGITS, "layout": LAYOUT, **fields}
    return AgentStatus(**values)


def view(*, open_round: OpenRound | None, registry: AgentRegistry, weighting: str = "samples",
         labels: LabelSkew | None = None, caps: Caps | None = None, next_round: int = 1) -> AdmissionView:
    task = TaskAgreement(load_task_card("digits"))
    task.layouts["f"] = LAYOUT
    return AdmissionView(
        run_id="run", next_round=next_round, open_round=open_round, closing=False, now=0.0, agents=registry,
        task=task, payloads=FedAvg(weighted_mean), versions=VersionLog(2), applied=AppliedVersions(),
        labels=labels or LabelSkew(10), enrolled=caps, max_samples=1000, claim_cap_multiple=2.0,
        weighting=weighting, kl_temperature=1.0)  # type: ignore[arg-type]


def open_round(number: int, selected: list[str], median_claim: float | None = None) -> OpenRound:
    announcement = RoundAnnouncement(
        run_id="run", round=number, task="train", task_ref=DIGITS, layouts={"f": LAYOUT}, algorithm="fedavg",
        training=LocalTraining(epochs=1, learning_rate=0.1, momentum=0.0, weight_decay=0.0), params={},
        selected=selected, states={}, init_seed=0, issued_at=0.0, deadline_s=10.0, last_round=5)
    return OpenRound(announcement, b"", 10.0, 0.0, len(selected), median_claim=median_claim)


def update(agent_id: str, round_number: int, samples: int = 10, **fields: object) -> Update:
    return Update(run_id="run", agent_id=agent_id, round=round_number, task="train", task_ref=DIGITS, family="f",
                  num_samples=samples, metrics=TrainMetrics(), **{"base_digest": None, "weights": WEIGHTS, **fields})


def topic(message: Update) -> ParsedTopic:
    return ParsedTopic("update", agent_id=message.agent_id, round=message.round)


def registry_of(*agents: str) -> AgentRegistry:
    registry = AgentRegistry(timeout_s=60.0)
    for agent_id in agents:
        registry.observe(status(agent_id), 0.0)
    return registry


def test_decisions_are_values_and_nothing_changes() -> None:
    registry = registry_of("a", "b")
    current = open_round(1, ["a"])
    v = view(open_round=current, registry=registry, caps=Caps({"a": 5}))
    policy = SynchronousPolicy()
    assert admit_update(topic(update("a", 1, samples=5)), update("a", 1, samples=5), v, policy) == Accept()
    cases = {
        "unselected": update("b", 1),
        "unknown_agent": update("z", 1),
        "wrong_run": update("a", 1).model_copy(update={"run_id": "other"}),
        "wrong_round": update("a", 2),
        "missing_payload": update("a", 1, weights={}, delta=WEIGHTS),  # the family bootstraps: weights wanted
    }
    for reason, message in cases.items():
        decision = admit_update(topic(message), message, v, policy)
        assert isinstance(decision, Reject) and decision.reason.value == reason, (reason, decision)
    assert current.updates == {} and current.rejected == 0  # admission only read the round


def test_a_claim_counts_for_at_most_what_the_coordinator_allows() -> None:
    """The enrolled max_samples where given, else twice the median claim the round's agents reported."""
    registry = registry_of("a", "b")
    enrolled = view(open_round=open_round(1, ["a", "b"], median_claim=100), registry=registry, caps=Caps({"a": 5}))
    liar = update("a", 1, samples=1_000_000)
    assert admit_update(topic(liar), liar, enrolled, SynchronousPolicy()) == Accept(samples=5)
    unenrolled = update("b", 1, samples=1_000_000)
    assert admit_update(topic(unenrolled), unenrolled, enrolled, SynchronousPolicy()) == Accept(samples=200)
    honest = update("b", 1, samples=150)
    assert admit_update(topic(honest), honest, enrolled, SynchronousPolicy()) == Accept()  # under the cap: as claimed
    no_median = view(open_round=open_round(1, ["b"]), registry=registry)
    assert admit_update(topic(unenrolled), unenrolled, no_median, SynchronousPolicy()) == Accept(samples=1000)


def test_the_delta_norm_and_kl_weighting_are_part_of_admission() -> None:
    registry = registry_of("a", "b")
    labels = LabelSkew(10)
    labels.observe("a", device="rpi", num_samples=10, label_counts=np.array([10] + [0] * 9))
    labels.observe("b", device="rpi", num_samples=10, label_counts=np.ones(10, np.int64))
    fedavg = FedAvg(weighted_mean)
    fedavg.aggregate(1, [update("a", 1)])
    state = fedavg.states["f"]
    current = open_round(2, ["a", "b"])
    v = view(open_round=current, registry=registry, weighting="kl", labels=labels, next_round=2)
    v = AdmissionView(**{**v.__dict__, "payloads": fedavg})
    small = update("a", 2, weights={}, delta={"w": np.full((2, 3), 0.1, np.float32)}, base_digest=state.digest)
    decision = admit_update(topic(small), small, v, SynchronousPolicy())
    assert isinstance(decision, Accept) and decision.norm is not None and np.isclose(decision.norm, np.sqrt(6) * 0.1)
    assert decision.weight == labels.weight_factor("a", 1.0) < 1.0  # a's labels are skewed: it weighs less
    huge = small.model_copy(update={"delta": {"w": np.full((2, 3), 10.0, np.float32)}})
    decision = admit_update(topic(huge), huge, v, SynchronousPolicy())
    assert isinstance(decision, Accept) and np.isclose(decision.norm, np.sqrt(6) * 10)  # measured; the engine clips


def test_asynchronous_admission_defers_instead_of_raising() -> None:
    registry = registry_of("a")
    buffered = open_round(3, ["a"])
    buffered.updates["a"] = update("a", 3)
    policy = FedBuffPolicy(buffer_size=2, max_staleness=2, exponent=0.5)
    second = update("a", 2)
    assert isinstance(admit_update(topic(second), second, view(open_round=buffered, registry=registry), policy), Defer)
    closing = view(open_round=None, registry=registry, next_round=4)
    assert isinstance(admit_update(topic(second), second, closing, policy), Defer)


def test_a_status_becomes_events() -> None:
    registry = registry_of("a")
    v = view(open_round=None, registry=registry)
    decision = admit_status(status("b"), "b", None, v)
    assert decision == Observe(status("b"))
    other_task = admit_status(status("b", layout="0" * 32), "b", None, v)
    assert isinstance(other_task, Observe) and [r.reject.reason.value for r in other_task.remarks] == ["task_mismatch"]
    bad_labels = admit_status(status("b", num_samples=3, label_counts=np.ones(3, np.int64)), "b", None, v)
    assert isinstance(bad_labels, Observe) and bad_labels.status.label_counts is None  # the status is kept, its counts not
    assert admit_status(status("b"), "c", None, v) == Reject(*_reason("topic_mismatch", "status names b"))
    assert isinstance(admit_status(status("b"), "b", "a", v), Reject)  # signed by a's key
    full = AgentRegistry(timeout_s=60.0, capacity=1)
    full.observe(status("a"), 0.0)
    refused = admit_status(status("b"), "b", None, view(open_round=None, registry=full))
    assert isinstance(refused, Reject) and refused.reason.value == "registry_full"
    assert registry.get("b") is None and full.get("b") is None  # nothing recorded: the engine applies


def _reason(value: str, detail: str) -> tuple[object, str]:
    from coordinator.reasons import RejectReason

    return RejectReason(value), detail
