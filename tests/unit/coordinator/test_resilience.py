"""The round engine under faults: over-selection, dropouts, lost sessions, restarts, stale retained state."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.app.driver import EngineDriver
from coordinator.app.service import CoordinatorService
from coordinator.settings import CoordinatorSettings
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import AgentStatus, CoordinatorStatus, PrivacySpent, RoundAnnouncement
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, hello, make_engine, rejected, send, update


def status(agent_id: str, state: str = "online", *, session: str | None = "s1", reconnects: int = 0,
           device: str = "rpi", privacy: PrivacySpent | None = None) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state=state, device=device, family="f", num_samples=10,  # type: ignore[arg-type]
                       num_eval_samples=2, version="t", timestamp=0.0, session=session, reconnects=reconnects,
                       privacy=privacy, task_ref=DIGITS, layout=LAYOUT)


def tell(engine: EngineDriver, message: AgentStatus) -> None:
    engine.on_message(TOPICS.agent_status(message.agent_id), encode_message(message))


def counter(metrics: CoordinatorMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_over_selection_closes_once_the_wanted_number_answered(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, fraction_fit=0.6, over_selection=0.5)
    for agent_id in "abcde":
        hello(engine, agent_id)
    engine.tick()
    assert engine.open is not None and len(engine.open.selected) == 5 and engine.open.wanted == 3
    for agent_id in engine.open.selected[:3]:
        send(engine, update(engine, agent_id, 1))
    engine.tick()  # three of five answered: enough, long before the deadline
    closed = engine.last_summary
    assert (closed.outcome, closed.answered, closed.surplus, closed.stragglers, closed.dropouts) == (
        "completed", 3, 2, 0, 0)
    assert closed.quorum == 2  # half of the wanted three, not of the five selected
    send(engine, update(engine, "e", 1))
    assert rejected(metrics, "late") == 1


def test_over_selection_quorum_counts_against_the_wanted_number(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, fraction_fit=0.5, over_selection=1.0, quorum_fraction=1.0)
    for agent_id in "abcd":
        hello(engine, agent_id)
    engine.tick()
    assert engine.open is not None and (len(engine.open.selected), engine.open.wanted) == (4, 2)
    send(engine, update(engine, engine.open.selected[0], 1))
    clock.now += 11
    engine.tick()
    closed = engine.last_summary
    assert (closed.outcome, closed.quorum, closed.stragglers) == ("quorum_missed", 2, 3)


def test_an_agent_that_went_offline_mid_round_is_a_dropout_even_when_back(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    for agent_id in "abcd":
        tell(engine, status(agent_id))
    engine.tick()
    tell(engine, status("c", "offline"))  # its last will
    tell(engine, status("c", session="s2"))  # rebooted, online again
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    clock.now += 11
    engine.tick()
    closed = engine.last_summary
    assert (closed.outcome, closed.answered, closed.dropouts, closed.stragglers) == ("completed", 2, 1, 1)
    assert counter(metrics, "fl_dropouts_total") == 1 and counter(metrics, "fl_stragglers_total") == 1
    assert counter(metrics, "fl_agent_restarts_total", device="rpi") == 1


def test_offline_stale_and_budget_exhausted_agents_are_never_selected(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, agent_timeout_s=30.0)
    tell(engine, status("stale"))
    clock.now += 31
    tell(engine, status("a")), tell(engine, status("b"))
    tell(engine, status("gone", "offline"))
    tell(engine, status("spent", "budget_exhausted"))
    tell(engine, status("spent-too", privacy=PrivacySpent(epsilon=8.0, delta=1e-5, budget_epsilon=8.0,
                                                          exhausted=True)))
    engine.tick()
    assert engine.open is not None and engine.open.selected == ["a", "b"]


def test_agent_reconnects_are_counted_once_and_restarts_by_session(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    tell(engine, status("a", reconnects=5))  # first sight: a baseline, whatever it says
    tell(engine, status("a", reconnects=7))
    tell(engine, status("a", "offline", reconnects=0))  # a last will repeats the count of its connect
    tell(engine, status("a", reconnects=8))
    tell(engine, status("a", session="s2", reconnects=1))  # a new process
    tell(engine, status("a", session="s2", reconnects=1))  # a heartbeat
    assert counter(metrics, "fl_agent_reconnects_total", device="rpi") == 2 + 1 + 1
    assert counter(metrics, "fl_agent_restarts_total", device="rpi") == 1


def test_a_lost_broker_session_gives_a_new_session_and_republishes(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    announcement = outbox.last(TOPICS.rounds_current)
    first = engine.run.session
    engine.on_connection(False)
    engine.on_connection(True, session_present=True)  # the broker kept our queue: same session
    assert engine.run.session == first
    engine.on_connection(False)
    outbox.sent.clear()
    engine.on_connection(True, session_present=False)
    assert engine.run.session != first
    status_message = decode_message(outbox.last(TOPICS.coordinator_status), CoordinatorStatus)
    assert (status_message.session, status_message.state) == (engine.run.session, "online")
    assert outbox.last(TOPICS.rounds_current) == announcement  # the same round, re-announced as it was


def test_connecting_with_no_round_open_clears_a_stale_announcement(tmp_path: Path) -> None:
    clock = Clock()
    _, outbox, _ = make_engine(tmp_path, clock)
    assert (TOPICS.rounds_current, b"", True) in outbox.sent


def test_a_restart_after_the_deadline_collects_for_a_grace_period(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, resume_grace_s=5.0)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    first_update = update(engine, "a", 1)
    send(engine, first_update)  # accepted, then lost with the process
    clock.now += 60
    again, outbox, _ = make_engine(tmp_path, clock, resume_grace_s=5.0)
    assert again.open is not None and again.open.number == 1 and again.open.deadline == clock.now + 5.0
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).round == 1
    hello(again, "a"), hello(again, "b")
    send(again, first_update)  # resent by the agent
    send(again, update(again, "b", 1))
    again.tick()
    closed = again.last_summary
    assert (closed.round, closed.outcome, closed.answered) == (1, "completed", 2)
    assert closed.duration_s >= 60  # measured from the announcement, not from the restart
    assert again.run.next_round == 2


def test_a_state_superseded_before_a_crash_is_cleared_after_the_restart(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock)
    hello(engine, "a"), hello(engine, "b")
    for number in (1, 2):
        engine.tick()  # opens the round (and publishes the state it starts from)
        send(engine, update(engine, "a", number)), send(engine, update(engine, "b", number))
        engine.tick()  # closes it: the checkpoint holds the next state, not published yet
    assert (TOPICS.global_state("f", 2), b"", True) not in outbox.sent
    # The process dies here. The restarted one publishes round 3's state and clears round 2's.
    _, outbox, _ = make_engine(tmp_path, clock)
    assert outbox.sent.index((TOPICS.global_state("f", 2), b"", True)) > [
        t for t, _, _ in outbox.sent].index(TOPICS.global_state("f", 3))


def test_the_rounds_log_is_completed_from_the_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock)
    hello(engine, "a"), hello(engine, "b")
    closed = []
    for number in (1, 2):
        engine.tick()
        send(engine, update(engine, "a", number)), send(engine, update(engine, "b", number))
        engine.tick()
        closed.append(engine.last_summary)
    log_path = tmp_path / "state" / "rounds.jsonl"
    log_path.write_text(json.dumps(closed[0].to_dict()) + "\n" + '{"round": 2, "torn')  # crashed mid-line
    settings = CoordinatorSettings(federation="t", state_dir=tmp_path / "state", rounds=3, http_port=0)
    service = CoordinatorService(settings, CollectorRegistry())
    service.driver.restore()
    assert [json.loads(line)["round"] for line in log_path.read_text().splitlines()] == [1, 2]
