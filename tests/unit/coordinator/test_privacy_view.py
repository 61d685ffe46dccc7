"""The coordinator's view of DP spending: from updates and statuses, exported, and in round summaries."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator.fleet.privacy import FleetPrivacy
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import AgentStatus, PrivacySpent, RoundAnnouncement
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, make_engine, send, update


def status(agent_id: str, device: str, epsilon: float | None, *, exhausted: bool = False) -> AgentStatus:
    privacy = None if epsilon is None else PrivacySpent(epsilon=epsilon, delta=1e-5, budget_epsilon=8.0,
                                                        exhausted=exhausted)
    return AgentStatus(agent_id=agent_id, state="budget_exhausted" if exhausted else "online", device=device,
                       family="f", num_samples=10, num_eval_samples=2, version="t", timestamp=0.0, privacy=privacy,
                       task_ref=DIGITS, layout=LAYOUT)


def gauge(metrics: CoordinatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_epsilon_is_exported_by_device_and_fleet_max_from_updates_and_statuses(tmp_path: Path) -> None:
    engine, _, metrics = make_engine(tmp_path, Clock(), min_available_agents=2, min_fit_agents=2)
    for message in (status("a", "rpi", 0.0), status("b", "phone", 0.0), status("c", "phone", 5.0, exhausted=True)):
        engine.on_message(TOPICS.agent_status(message.agent_id), encode_message(message))
    # c never sends an update (its budget is spent) but its status still counts.
    assert gauge(metrics, "fl_privacy_epsilon", device="phone") == 5.0
    assert gauge(metrics, "fl_privacy_epsilon_max") == 5.0
    assert gauge(metrics, "fl_privacy_budget_exhausted_agents", device="phone") == 1.0

    engine.tick()
    spent = PrivacySpent(epsilon=6.5, delta=1e-5, budget_epsilon=8.0)
    send(engine, update(engine, "a", 1).model_copy(update={"privacy": spent}))
    assert gauge(metrics, "fl_privacy_epsilon", device="rpi") == 6.5
    assert gauge(metrics, "fl_privacy_epsilon", device="phone") == 5.0
    assert gauge(metrics, "fl_privacy_epsilon_max") == 6.5

    # A stale heartbeat with less spent does not lower what the coordinator shows.
    engine.on_message(TOPICS.agent_status("a"), encode_message(status("a", "rpi", 1.0)))
    assert gauge(metrics, "fl_privacy_epsilon", device="rpi") == 6.5

    send(engine, update(engine, "b", 1))
    engine.tick()
    closed = engine.last_summary
    assert (closed.epsilon_max, closed.budget_exhausted) == (6.5, 1)


def test_exhausted_agents_are_not_selected(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock, min_available_agents=2, min_fit_agents=2)
    for message in (status("a", "rpi", 1.0), status("b", "rpi", 1.0), status("c", "rpi", 8.0, exhausted=True)):
        engine.on_message(TOPICS.agent_status(message.agent_id), encode_message(message))
    engine.tick()
    announcement = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert announcement.selected == ["a", "b"]


def test_a_decommissioned_agent_leaves_the_export(tmp_path: Path) -> None:
    engine, _, metrics = make_engine(tmp_path, Clock())
    engine.on_message(TOPICS.agent_status("a"), encode_message(status("a", "jetson", 2.0)))
    engine.on_message(TOPICS.agent_status("b"), encode_message(status("b", "rpi", 3.0)))
    engine.on_message(TOPICS.agent_status("b"), b"")  # retained status cleared
    assert gauge(metrics, "fl_privacy_epsilon", device="rpi") is None
    assert gauge(metrics, "fl_privacy_epsilon_max") == 2.0


def test_agents_without_dp_leave_privacy_out_of_the_summary(tmp_path: Path) -> None:
    engine, _, metrics = make_engine(tmp_path, Clock())
    for agent_id in ("a", "b"):
        engine.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, "rpi", None)))
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick()
    assert engine.last_summary.epsilon_max is None
    assert gauge(metrics, "fl_privacy_epsilon_max") == 0.0  # an unlabelled gauge always exports
    assert gauge(metrics, "fl_privacy_epsilon", device="rpi") is None


def test_an_update_that_spends_the_budget_stops_selection_before_the_next_status(tmp_path: Path) -> None:
    engine, outbox, _ = make_engine(tmp_path, Clock(), min_available_agents=1, min_fit_agents=1)
    for agent_id in ("a", "b"):
        engine.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, "rpi", 0.0)))
    engine.tick()
    spent = PrivacySpent(epsilon=7.9, delta=1e-5, budget_epsilon=8.0, exhausted=True)
    send(engine, update(engine, "a", 1).model_copy(update={"privacy": spent}))
    send(engine, update(engine, "b", 1))
    engine.tick()  # closes round 1
    engine.tick()  # opens round 2: a's status still says online, its update said otherwise
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).selected == ["b"]


def test_agents_with_a_spent_budget_still_score_the_final_model(tmp_path: Path) -> None:
    """Evaluation trains nothing and spends no budget: without them a DP run would wait forever for its
    final evaluation once every budget is spent."""
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock, rounds=1, min_available_agents=2, min_fit_agents=2)
    for agent_id in ("a", "b"):
        engine.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, "rpi", 0.0)))
    engine.tick()
    spent = PrivacySpent(epsilon=8.0, delta=1e-5, budget_epsilon=8.0, exhausted=True)
    for agent_id in ("a", "b"):
        send(engine, update(engine, agent_id, 1).model_copy(update={"privacy": spent}))
    engine.tick()
    engine.tick()
    final = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert (final.round, final.task, final.selected) == (2, "evaluate", ["a", "b"])


def test_an_agent_whose_ledger_went_back_trains_no_more_until_it_reports_its_highest_again(tmp_path: Path) -> None:
    """A restored backup of an agent's state directory reports less than it spent: its data's budget would be spent
    again. It stays known (evaluated, counted) but is not selected to train until it reports at least as much."""
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, min_available_agents=2, min_fit_agents=2)
    registry = engine.engine.parts.registry

    def report(agent_id: str, epsilon: float, seq: int) -> None:
        message = status(agent_id, "rpi", epsilon).model_copy(update={"epoch": 1, "seq": seq})
        engine.on_message(TOPICS.agent_status(agent_id), encode_message(message))

    report("a", 3.0, 1), report("b", 0.0, 1)
    assert [r.agent_id for r in registry.available(clock.now)] == ["a", "b"]
    report("a", 1.0, 2)  # went back
    assert [r.agent_id for r in registry.available(clock.now)] == ["b"]
    assert gauge(metrics, "fl_privacy_epsilon_max") == 3.0
    engine.tick()
    assert engine.engine.run.open is None  # two needed, one selectable
    report("a", 3.0, 3)
    assert [r.agent_id for r in registry.available(clock.now)] == ["a", "b"]


def test_a_restarted_coordinator_still_knows_what_each_agent_spent(tmp_path: Path) -> None:
    """The highest figures are checkpointed: after a restart, a rolled-back ledger's status (perhaps the only one
    the broker retains) is still caught, and the export does not go down."""
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, min_available_agents=2, min_fit_agents=2)
    for agent_id, epsilon in (("a", 3.0), ("b", 0.5)):
        engine.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, "rpi", epsilon)))
    engine.tick()
    for agent_id in ("a", "b"):
        send(engine, update(engine, agent_id, 1))
    engine.tick()
    assert engine.last_summary is not None and engine.last_summary.outcome == "completed"

    restarted, _, metrics = make_engine(tmp_path, Clock())
    assert gauge(metrics, "fl_privacy_epsilon_max") == 3.0  # before any status is heard again
    registry = restarted.engine.parts.registry
    rolled_back = status("a", "rpi", 1.0).model_copy(update={"epoch": 2, "seq": 1})
    restarted.on_message(TOPICS.agent_status("a"), encode_message(rolled_back))
    restarted.on_message(TOPICS.agent_status("b"), encode_message(status("b", "rpi", 0.5)))
    assert [r.agent_id for r in registry.available(0.0)] == ["b"]
    assert gauge(metrics, "fl_privacy_epsilon", device="rpi") == 3.0


def test_a_checkpoints_privacy_figures_are_validated_and_merged_keeping_the_larger() -> None:
    privacy = FleetPrivacy(CoordinatorMetrics(CollectorRegistry()))
    privacy.observe("a", "rpi", PrivacySpent(epsilon=2.0, delta=1e-5, budget_epsilon=8.0, exhausted=False))
    privacy.load_state_dict({"a": ["rpi", 1.0, 1e-5, False], "b": ["jetson", 4.0, 1e-5, True]})
    assert privacy.state_dict() == {"a": ["rpi", 2.0, 1e-5, False], "b": ["jetson", 4.0, 1e-5, True]}
    assert privacy.epsilon_max == 4.0 and privacy.exhausted == 1
    for bad in ({"a": ["rpi", -1.0, 0.0, False]}, {"a": ["rpi", float("nan"), 0.0, False]}, {"a": ["rpi", 1.0]},
                {"a": ["rpi", 1.0, 0.0, 1]}, {"a": [3, 1.0, 0.0, False]}):
        with pytest.raises(ValueError, match="privacy of 'a'"):
            privacy.load_state_dict(bad)
