"""Freshness at the coordinator: the run's epoch in everything it signs, kept across restarts, and agents'
statuses ordered by (process epoch, seq) so that a replayed older one changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.app.driver import EngineDriver
from coordinator.fleet.agents import AgentRegistry
from coordinator.fleet.freshness import StatusMark
from coordinator.round.epochs import FRESHNESS, new_epoch
from coordinator.state.checkpoint import CheckpointStore
from protocol.codec import decode, encode
from protocol.messages import AgentStatus, CoordinatorStatus, GlobalState, RoundAnnouncement
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, make_engine, rejected, send, update

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "freshness"
P = 1_700_000_000_000
"""An agent process's epoch."""


def status(agent_id: str, epoch: int, seq: int, state: str = "online", session: str = "s1") -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state=state, device="rpi", family="f", num_samples=10,  # type: ignore[arg-type]
                       num_eval_samples=2, version="t", timestamp=0.0, session=session, task_ref=DIGITS,
                       layout=LAYOUT, epoch=epoch, seq=seq)


def tell(engine: EngineDriver, message: AgentStatus) -> None:
    engine.on_message(TOPICS.agent_status(message.agent_id), encode_message(message))


def state_of(engine: EngineDriver, agent_id: str) -> str:
    record = engine.parts.registry.get(agent_id)
    assert record is not None
    return record.status.state


def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "state")


def test_an_older_runs_checkpoint_put_back_after_a_newer_run_resumes_above_its_epoch(tmp_path: Path) -> None:
    """Run A's checkpoint moved away, run B started (a newer epoch), A's put back: A resumes, but under a new
    epoch above B's, or every agent that accepted B would drop its announcements and states as stale."""
    clock = Clock()
    first, _, _ = make_engine(tmp_path, clock)
    run_a_round(first, clock)
    store = CheckpointStore(tmp_path / "state")
    store.path("checkpoint").rename(tmp_path / "run-a.msgpack")
    clock.now += 5.0
    second, _, _ = make_engine(tmp_path, clock)
    assert second.run.run_id != first.run.run_id and second.run.epoch > first.run.epoch
    (tmp_path / "run-a.msgpack").rename(store.path("checkpoint"))
    clock.now += 5.0
    third, _, _ = make_engine(tmp_path, clock)
    assert third.run.run_id == first.run.run_id and third.run.epoch > second.run.epoch
    assert decode(store.path(FRESHNESS).read_bytes())["epoch"] == third.run.epoch


def run_a_round(engine: EngineDriver, clock: Clock) -> None:
    for agent_id in ("a", "b"):
        tell(engine, status(agent_id, P, 1))
    engine.tick()
    assert engine.open is not None
    for agent_id in ("a", "b"):
        send(engine, update(engine, agent_id, engine.open.number))
    engine.tick()


# -- the run's epoch ----------------------------------------------------------------------

def test_a_new_run_takes_the_wall_clock_in_ms_and_everything_it_signs_carries_it(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock)
    assert engine.run.epoch == new_epoch(clock.now, 0) == 1_000_000
    run_a_round(engine, clock)
    assert engine.last_summary is not None and engine.last_summary.outcome == "completed"
    engine.tick()  # round 2 opens: the new global state goes out
    assert decode_message(outbox.last(TOPICS.coordinator_status), CoordinatorStatus).epoch == engine.run.epoch
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).epoch == engine.run.epoch
    state = decode_message(outbox.last(TOPICS.global_state("f", 2)), GlobalState)
    assert state.epoch == engine.run.epoch and state.digest == engine.strategy.states["f"].digest
    assert decode_message(engine.offline_status(), CoordinatorStatus).epoch == engine.run.epoch  # its will too
    assert store(tmp_path).load("checkpoint")["epoch"] == engine.run.epoch  # type: ignore[index]
    assert store(tmp_path).load(FRESHNESS)["epoch"] == engine.run.epoch  # type: ignore[index]


def test_a_resumed_coordinator_keeps_its_epoch_whatever_the_clock_says(tmp_path: Path) -> None:
    clock = Clock()
    first, _, _ = make_engine(tmp_path, clock)
    run_a_round(first, clock)
    for now in (5000.0, 10.0):  # restarted later, and with the clock set back
        clock.now = now
        again, _, _ = make_engine(tmp_path, clock)
        assert (again.run.run_id, again.run.epoch) == (first.run.run_id, first.run.epoch)


def test_a_new_run_in_the_same_state_dir_starts_above_every_epoch_it_ran(tmp_path: Path) -> None:
    clock = Clock()
    first, _, _ = make_engine(tmp_path, clock)
    store(tmp_path).path("checkpoint").unlink()  # moved away by an operator to start a new run
    clock.now = 10.0  # and the clock set back
    second, _, _ = make_engine(tmp_path, clock)
    assert second.run.run_id != first.run.run_id and second.run.epoch == first.run.epoch + 1


def test_a_fresh_coordinator_elsewhere_with_the_same_key_starts_higher(tmp_path: Path) -> None:
    clock = Clock()
    first, _, _ = make_engine(tmp_path / "here", clock)
    clock.now += 0.25
    second, _, _ = make_engine(tmp_path / "elsewhere", clock)  # a new state dir: its only reference is the clock
    assert second.run.run_id != first.run.run_id and second.run.epoch == first.run.epoch + 250


def test_a_checkpoint_that_predates_epochs_gets_one_and_keeps_it(tmp_path: Path) -> None:
    clock = Clock()
    first, _, _ = make_engine(tmp_path, clock)
    run_a_round(first, clock)
    tell(first, status("a", P, 2)), tell(first, status("b", P, 2))
    first.tick()
    assert first.open is not None and first.open.number == 2
    saved = store(tmp_path)
    checkpoint = saved.load("checkpoint")
    open_round = saved.load("open_round")
    assert checkpoint is not None and open_round is not None
    del checkpoint["epoch"], checkpoint["format"], open_round["format"]
    old_announcement = decode(open_round["announcement"])
    del old_announcement["epoch"]  # as an older coordinator wrote it
    saved.save("checkpoint", checkpoint)
    saved.save("open_round", {**open_round, "announcement": encode(old_announcement)})
    saved.path(FRESHNESS).unlink()
    clock.now += 2.0
    second, outbox, _ = make_engine(tmp_path, clock)
    assert second.run.run_id == first.run.run_id and second.run.epoch == new_epoch(clock.now, 0) > first.run.epoch
    assert second.open is not None and second.open.number == 2  # resumed, and re-announced with the new epoch
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).epoch == second.run.epoch
    clock.now += 2.0
    third, _, _ = make_engine(tmp_path, clock)  # its next start: the epoch it was given, not another
    assert third.run.epoch == second.run.epoch


# -- agents' statuses ---------------------------------------------------------------------

def test_a_replayed_older_status_of_an_agent_changes_nothing(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    tell(engine, status("a", P, 1)), tell(engine, status("a", P, 2))
    tell(engine, status("a", P - 60_000, 9, "offline", session="s0"))  # the will of its previous process
    tell(engine, status("a", P - 60_000, 8, session="s0"))  # a heartbeat of it
    tell(engine, status("a", P, 1, "budget_exhausted"))  # an earlier status of this process
    assert rejected(metrics, "stale_status", kind="agent_status") == 3
    assert state_of(engine, "a") == "online"
    assert metrics.registry.get_sample_value("fl_agent_restarts_total", {"device": "rpi"}) in (None, 0.0)
    tell(engine, status("a", P, 2))  # the newest again (retained, delivered again after a reconnect): not a replay
    tell(engine, status("a", P + 1, 1, session="s2"))  # a new process
    assert rejected(metrics, "stale_status", kind="agent_status") == 3
    assert metrics.registry.get_sample_value("fl_agent_restarts_total", {"device": "rpi"}) == 1


def test_the_last_will_is_taken_once_per_process(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    will = status("a", P, 0, "offline")
    tell(engine, status("a", P, 3))
    tell(engine, will)  # its connection broke: the broker published the will
    assert state_of(engine, "a") == "offline"
    tell(engine, will)  # the same again, while it is the newest: nothing changes, nothing counted
    tell(engine, status("a", P, 4))  # reconnected
    tell(engine, will)  # replayed
    assert state_of(engine, "a") == "online" and rejected(metrics, "stale_status", kind="agent_status") == 1


def test_agents_that_predate_freshness_are_not_ordered_until_they_upgrade(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    tell(engine, status("a", 0, 0)), tell(engine, status("a", 0, 0, "offline")), tell(engine, status("a", 0, 0))
    assert state_of(engine, "a") == "online" and rejected(metrics, "stale_status", kind="agent_status") == 0
    tell(engine, status("a", P, 1))
    tell(engine, status("a", 0, 0, "offline"))  # an old status from before its upgrade
    assert state_of(engine, "a") == "online" and rejected(metrics, "stale_status", kind="agent_status") == 1


def test_marks_survive_a_coordinator_restart(tmp_path: Path) -> None:
    clock = Clock()
    first, _, _ = make_engine(tmp_path, clock)
    tell(first, status("a", P, 1)), tell(first, status("b", P, 1))
    tell(first, status("a", P, 5)), tell(first, status("b", P, 5))
    first.tick()
    send(first, update(first, "a", 1)), send(first, update(first, "b", 1))
    first.tick()  # the round closed: the marks are in the state directory
    assert json.loads(json.dumps(store(tmp_path).load(FRESHNESS)["agents"])) == {  # type: ignore[index]
        "a": [P, 5, -1, 0], "b": [P, 5, -1, 0]}
    clock.now += 5
    second, _, metrics = make_engine(tmp_path, clock)
    tell(second, status("a", P, 5))  # its retained status, delivered to the new process: taken
    tell(second, status("a", P, 2, "offline"))  # replayed
    tell(second, status("b", P - 1, 7, "offline"))  # replayed, from b's previous process
    assert rejected(metrics, "stale_status", kind="agent_status") == 2
    assert state_of(second, "a") == "online" and second.parts.registry.get("b") is None


def test_a_forgotten_agent_is_not_brought_back_by_its_last_status() -> None:
    registry = AgentRegistry(timeout_s=30.0, capacity=3)
    last = status("a", P, 4)
    registry.observe(last, now=0.0)
    assert registry.stale(last) is None  # the newest again, e.g. retained
    registry.forget_silent(now=1000.0, after_s=100.0)
    assert registry.stale(last) is not None and registry.stale(status("a", P, 5)) is None
    for i, agent_id in enumerate("bcde"):  # marks are as bounded as the records
        registry.observe(status(agent_id, P, 1), now=2000.0 + 100 * i)
    assert len(registry.marks()) == 3


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("agent_*.json")))
def test_the_golden_freshness_vectors_of_agent_statuses(name: str) -> None:
    side = json.loads((GOLDEN / f"{name}.json").read_text())
    message = decode_message((GOLDEN / f"{name}.msgpack").read_bytes(), AgentStatus)
    for case in side["cases"]:
        mark = case["state"]
        stale = None if mark is None else StatusMark(mark["epoch"], mark["seq"], mark["will_after"]).staleness(
            message.epoch, message.seq)
        outcome = ("accept", None) if stale is None else ("drop", "stale_status")
        assert outcome == (case["outcome"], case["reason"]), case
