"""The engine is sans-IO: events in, actions out. Driven here without a driver, it writes no file and
publishes nothing by itself; what it asks for comes back as values, in order."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.round.actions import Background, Publish, RoundClosed, Save
from coordinator.round.engine import RoundEngine
from coordinator.round.resume import Saved
from coordinator.settings import CoordinatorSettings
from coordinator.strategies import build_strategy
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import AgentStatus, TrainMetrics, Update
from protocol.wire import encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, weights


def status(agent_id: str) -> bytes:
    return encode_message(AgentStatus(agent_id=agent_id, state="online", device="rpi", family="f", num_samples=10,
                                      num_eval_samples=2, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT))


def test_a_round_as_actions(tmp_path: Path) -> None:
    clock = Clock()
    settings = CoordinatorSettings(federation="t", state_dir=tmp_path / "state", rounds=1, min_available_agents=2,
                                   min_fit_agents=2, enrollment="open", evaluate_final=False)
    engine = RoundEngine(settings, build_strategy(settings), CoordinatorMetrics(CollectorRegistry()), clock=clock,
                         wall_clock=clock)
    started = engine.restore(Saved())
    # the new run's epoch (and the freshness marks) first, then its checkpoint, which carries the epoch too
    assert [type(a) for a in started] == [Save, Save] and started[0].name == "freshness"
    assert started[1].name == "checkpoint" and started[1].checkpoint
    assert started[1].data["epoch"] == started[0].data["epoch"] == engine.run.epoch > 0
    connected = engine.on_connection(True)
    assert [(a.topic, a.retain) for a in connected if isinstance(a, Publish)] == [
        (TOPICS.coordinator_status, True), (TOPICS.task, True),  # status, the run's card,
        (TOPICS.rounds_current, True)]  # and a stale announcement cleared
    assert engine.on_message(TOPICS.agent_status("a"), status("a")) == []
    assert engine.on_message(TOPICS.agent_status("b"), status("b")) == []
    opened = engine.tick().actions
    # open_round first, then the announcement and status, then the card again: the round fixed family f's layout
    assert [type(a) for a in opened] == [Save, Publish, Publish, Publish]
    assert opened[0].name == "open_round" and opened[1].topic == TOPICS.rounds_current
    assert opened[3].topic == TOPICS.task and opened[3].retain
    run_id = engine.run.run_id
    for agent_id in ("a", "b"):
        update = Update(run_id=run_id, agent_id=agent_id, round=1, task="train", task_ref=DIGITS, family="f",
                        base_digest=None, num_samples=10, weights=weights(1.0), metrics=TrainMetrics())
        assert engine.on_message(TOPICS.update(agent_id, 1), encode_message(update)) == []
    closing = engine.tick().actions
    assert len(closing) == 1 and isinstance(closing[0], Background) and engine.run.closing
    assert engine.tick().actions == [] and engine.open is None  # nothing opens while the round closes
    closure = closing[0].job()  # what the driver runs off the loop
    assert closure.checkpoint is not None and closure.checkpoint["next_round"] == 2
    applied = engine.closed(closure)
    assert isinstance(applied[0], RoundClosed) and applied[0].summary.outcome == "completed"
    assert engine.finished and any(isinstance(a, Publish) and a.topic == TOPICS.global_state("f", 2) for a in applied)
    assert not (tmp_path / "state").exists()  # the engine wrote nothing: writing is the driver's job
