"""The round engine driven directly: fake clock, an outbox that records, no broker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from coordinator.app.driver import EngineDriver
from coordinator.round.engine import RoundEngine
from coordinator.settings import CoordinatorSettings
from coordinator.state.checkpoint import CheckpointError, CheckpointStore
from coordinator.state.rounds import RoundSummary
from coordinator.strategies import build_strategy
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import AgentStatus, GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.topics import Topics
from protocol.version import SOFTWARE_VERSION
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS, layout

TOPICS = Topics("t")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bool]] = []

    def publish(self, topic: str, payload: bytes, *, retain: bool) -> None:
        self.sent.append((topic, payload, retain))

    def last(self, topic: str) -> bytes:
        return [p for t, p, _ in self.sent if t == topic][-1]


def make_engine(tmp_path: Path, clock: Clock, **overrides: object) -> tuple[EngineDriver, Outbox, CoordinatorMetrics]:
    """The engine with a driver that performs its actions at once: publishing into ``Outbox``, state files
    into the state directory, and a closing round's job inline."""
    fields: dict[str, object] = {"federation": "t", "state_dir": tmp_path / "state", "rounds": 3,
                                 "min_available_agents": 2, "min_fit_agents": 2, "round_deadline_s": 10.0, "enrollment": "open",
                                 "quorum_fraction": 0.5, **overrides}
    settings = CoordinatorSettings(**fields)
    metrics = CoordinatorMetrics(CollectorRegistry())
    outbox = Outbox()
    engine = RoundEngine(settings, build_strategy(settings), metrics, clock=clock, wall_clock=clock)
    driver = EngineDriver(engine, outbox, CheckpointStore(settings.state_dir))
    driver.restore()
    driver.on_connection(True)
    return driver, outbox, metrics


def hello(engine: EngineDriver, agent_id: str, family: str = "f", model: str | None = None, samples: int = 10) -> None:
    """``model``: the layout the agent reports; default: that of the ``weights`` it sends."""
    status = AgentStatus(agent_id=agent_id, state="online", device="rpi", family=family, num_samples=samples,
                         num_eval_samples=2, version="t", timestamp=0.0, task_ref=DIGITS, layout=model or LAYOUT)
    engine.on_message(TOPICS.agent_status(agent_id), encode_message(status))


def weights(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value, dtype=np.float32), "b": np.full(3, value, dtype=np.float32)}


LAYOUT = layout(weights(0.0))
"""What every agent of these tests reports: the layout of the arrays it sends."""


def update(engine: EngineDriver, agent_id: str, round_number: int, samples: int = 10, **payload: object) -> Update:
    announcement = decode_message(engine.outbox.last(TOPICS.rounds_current), RoundAnnouncement)  # type: ignore[attr-defined]
    ref = announcement.states.get("f")
    fields: dict[str, object] = {"weights": weights(1.0)} if ref is None else {"delta": weights(0.5)}
    fields.update(payload)
    return Update(run_id=engine.run.run_id, agent_id=agent_id, round=round_number, task=announcement.task, task_ref=DIGITS,
                  family="f", base_digest=ref.digest if ref else None, num_samples=samples,
                  metrics=TrainMetrics(eval_loss=1.0, eval_accuracy=0.5, num_eval_samples=2), **fields)


def send(engine: EngineDriver, message: Update, topic_agent: str | None = None, topic_round: int | None = None) -> None:
    engine.on_message(TOPICS.update(topic_agent or message.agent_id, message.round if topic_round is None else topic_round),
                      encode_message(message))


def rejected(metrics: CoordinatorMetrics, reason: str, kind: str = "update") -> float:
    return metrics.registry.get_sample_value("fl_messages_rejected_total", {"kind": kind, "reason": reason}) or 0.0


def test_waits_for_enough_agents_then_announces(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock)
    hello(engine, "a")
    engine.tick()
    assert engine.open is None
    hello(engine, "b")
    engine.tick()
    assert engine.open is not None and engine.open.number == 1
    announcement = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert announcement.selected == ["a", "b"] and announcement.states == {}


def test_full_round_aggregates_and_publishes_the_new_state(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock, claim_cap_multiple=0,  # the plain sample-weighted mean
                                          max_norm_ratio=0)
    hello(engine, "a", samples=10), hello(engine, "b", samples=30)
    engine.tick()
    send(engine, update(engine, "a", 1, samples=10, weights=weights(1.0)))
    send(engine, update(engine, "b", 1, samples=30, weights=weights(1.0)))
    engine.tick()  # everyone answered: closes without waiting for the deadline
    assert engine.last_summary.outcome == "completed"
    engine.tick()  # opens round 2 and publishes the agreed first state
    np.testing.assert_allclose(decode_message(outbox.last(TOPICS.global_state("f", 2)), GlobalState).weights["w"], 1.0)
    send(engine, update(engine, "a", 2, samples=10, delta=weights(1.0)))
    send(engine, update(engine, "b", 2, samples=30, delta=weights(3.0)))
    engine.tick(), engine.tick()  # closes round 2, opens round 3 with the aggregated state
    state = decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState)
    np.testing.assert_allclose(state.weights["w"], 1.0 + 2.5)  # (10 * 1 + 30 * 3) / 40
    assert metrics.registry.get_sample_value("fl_rounds_total", {"outcome": "completed"}) == 2


def test_bad_updates_are_dropped_and_counted_by_reason(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    for agent_id in ("a", "b", "c", "d"):
        hello(engine, agent_id)
    engine.tick()
    engine.open.announcement.selected.remove("d")  # d is known but not selected  # type: ignore[union-attr]
    good = update(engine, "a", 1)

    engine.on_message(TOPICS.update("a", 1), b"\xc1 not msgpack")
    send(engine, update(engine, "ghost", 1))
    send(engine, update(engine, "d", 1))
    send(engine, update(engine, "a", 7))
    send(engine, update(engine, "a", 0), topic_round=0)
    send(engine, good, topic_agent="b")
    send(engine, good.model_copy(update={"run_id": "other"}))
    nan = encode_message(good).replace(np.float32(1.0).tobytes(), np.float32("nan").tobytes(), 1)
    engine.on_message(TOPICS.update("a", 1), nan)
    send(engine, good)
    send(engine, good)
    assert {reason: rejected(metrics, reason) for reason in (
        "malformed", "unknown_agent", "unselected", "wrong_round", "late", "topic_mismatch", "wrong_run",
        "non_finite", "duplicate")} == {
        "malformed": 1, "unknown_agent": 1, "unselected": 1, "wrong_round": 1, "late": 1, "topic_mismatch": 1,
        "wrong_run": 1, "non_finite": 1, "duplicate": 1}
    assert list(engine.open.updates) == ["a"]  # type: ignore[union-attr]
    assert metrics.registry.get_sample_value("fl_updates_total", {"outcome": "rejected"}) == 9


def test_a_bootstrap_layout_outvoted_by_the_majority_is_dropped(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock)
    for agent_id in ("a", "b", "c"):
        hello(engine, agent_id)
    engine.tick()
    # The agents' statuses pinned the family's layout, and the round announces it: an update of another
    # layout is refused on arrival (the strategy's own majority vote is tested in test_streaming_rounds).
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).layouts == {"f": LAYOUT}
    send(engine, update(engine, "a", 1, weights={"w": np.zeros((3, 3), np.float32)}, samples=1000))  # first, odd
    send(engine, update(engine, "b", 1))
    send(engine, update(engine, "c", 1))
    assert rejected(metrics, "task_mismatch") == 1
    clock.now += 11  # a's answer never counted: the round closes at its deadline, with quorum
    engine.tick()
    assert engine.last_summary.outcome == "completed"
    assert rejected(metrics, "task_mismatch") == 1 and rejected(metrics, "bad_shape") == 0
    assert engine.strategy.states["f"].weights["w"].shape == (2, 3)


def test_deadline_closes_with_quorum_and_counts_stragglers(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1))
    clock.now += 9.9
    engine.tick()
    assert engine.open is not None
    clock.now += 0.2
    engine.tick()
    closed = engine.last_summary
    assert (closed.outcome, closed.answered, closed.stragglers) == ("completed", 1, 1)
    send(engine, update(engine, "b", 1))
    assert rejected(metrics, "late") == 1


def test_missed_quorum_closes_the_round_and_moves_on(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, quorum_fraction=1.0)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1))
    clock.now += 11
    engine.tick()
    assert engine.last_summary.outcome == "quorum_missed"
    assert engine.strategy.states == {}  # nothing aggregated
    engine.tick()
    assert engine.open is not None and engine.open.number == 2
    assert metrics.registry.get_sample_value("fl_rounds_total", {"outcome": "quorum_missed"}) == 1


def test_restart_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick()
    engine.tick()  # round 2 is open when the process "dies"
    digest = engine.strategy.states["f"].digest

    again, outbox, _ = make_engine(tmp_path, clock)
    assert again.run.run_id == engine.run.run_id
    assert again.open is not None and again.open.number == 2  # deadline not passed: same round continues
    assert again.strategy.states["f"].digest == digest
    assert again.last_summary is not None and again.last_summary.round == 1
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).round == 2

    clock.now += 60  # restarted after the deadline, without a grace period: closed as interrupted, numbers move on
    third, _, _ = make_engine(tmp_path, clock, resume_grace_s=0.0)
    assert third.last_summary is not None and third.last_summary.outcome == "interrupted" and third.run.next_round == 3 and third.open is None


def test_a_different_algorithm_refuses_the_checkpoint(tmp_path: Path) -> None:
    clock = Clock()
    make_engine(tmp_path, clock)
    store = CheckpointStore(tmp_path / "state")
    data = store.load("checkpoint")
    assert data is not None
    store.save("checkpoint", {k: v for k, v in data.items() if k != "format"} | {"algorithm": "scaffold"})
    with pytest.raises(CheckpointError, match="scaffold run"):
        make_engine(tmp_path, clock)


def test_an_aggregation_precondition_fails_the_round_with_its_reason_and_the_run_goes_on(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock, aggregator="krum", byzantine_f=1, min_available_agents=4,
                                          min_fit_agents=4)
    closed: list[RoundSummary] = []
    engine.on_round_closed = closed.append
    for agent_id in ("a", "b", "c", "d"):
        hello(engine, agent_id)
    engine.tick()
    for agent_id in ("a", "b", "c", "d"):
        send(engine, update(engine, agent_id, 1))
    engine.tick(), engine.tick()  # a bootstrap takes the agreed proposal, by no rule: round 2 opens
    first = engine.strategy.states["f"]
    for agent_id in ("a", "b", "c", "d"):
        send(engine, update(engine, agent_id, 2))
    engine.tick()  # everyone answered, but Krum with f = 1 needs n > 4
    failed = engine.last_summary
    assert (failed.round, failed.outcome, failed.reason) == (2, "failed", "too_few_updates")
    assert failed.detail is not None and "n > 2f + 2 = 4, got n=4" in failed.detail
    assert engine.strategy.states == {"f": first}  # nothing changed
    assert metrics.registry.get_sample_value("fl_rounds_total", {"outcome": "failed"}) == 1
    assert metrics.registry.get_sample_value("fl_aggregation_failures_total", {"reason": "too_few_updates"}) == 1
    labels = {"version": SOFTWARE_VERSION, "federation": "t", "algorithm": "fedavg", "aggregator": "krum(f=1)"}
    assert metrics.registry.get_sample_value("fl_coordinator_info", labels) == 1
    again, _, _ = make_engine(tmp_path, clock, aggregator="krum", byzantine_f=1)  # the summary survives a restart
    assert again.last_summary is not None and again.last_summary.detail == failed.detail

    hello(engine, "e")  # a fifth agent: the next round has enough updates
    engine.tick()
    assert engine.open is not None and engine.open.number == 3
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).states["f"].round == 2  # unchanged
    for agent_id in ("a", "b", "c", "d", "e"):
        send(engine, update(engine, agent_id, 3))
    engine.tick()
    assert engine.last_summary.outcome == "completed" and engine.strategy.states["f"].round == 4
    assert [s.reason for s in closed] == [None, "too_few_updates", None]


def test_a_state_that_overflows_fails_the_round_and_the_coordinator_carries_on(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock)
    closed: list[RoundSummary] = []
    engine.on_round_closed = closed.append
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick()
    engine.tick()
    huge = {"w": np.full((2, 3), 3e38, dtype=np.float32), "b": np.full(3, 3e38, dtype=np.float32)}  # finite
    for round_number in (2, 3):  # 1 + 3e38 is finite; 3e38 + 3e38 is not, in float32
        send(engine, update(engine, "a", round_number, delta=huge)), send(engine, update(engine, "b", round_number,
                                                                                         delta=huge))
        engine.tick()
        engine.tick()
    assert [(s.outcome, s.reason) for s in closed] == [
        ("completed", None), ("completed", None), ("failed", "non_finite_result")]
    assert metrics.registry.get_sample_value("fl_aggregation_failures_total", {"reason": "non_finite_result"}) == 1
    assert np.isfinite(engine.strategy.states["f"].weights["w"]).all() and engine.strategy.states["f"].round == 3
    assert engine.open is not None and engine.open.number == 4  # the next round opened from the last good state
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).states["f"].round == 3


def test_the_first_hello_does_not_decide_the_layout(tmp_path: Path) -> None:
    """An agent whose first hello claims a wrong layout, then honest agents: no layout is pinned until a round's
    quorum is online and a strict majority agrees; the run opens with the honest layout, the other refused."""
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock)
    hello(engine, "wrong", model="0" * 32)
    engine.tick()
    assert engine.open is None and engine.parts.task.layouts == {}  # one hello: nothing decided
    hello(engine, "a")
    engine.tick()
    assert engine.open is None and engine.parts.task.layouts == {}  # a tie: wait for more agents
    hello(engine, "b")
    engine.tick()
    assert engine.parts.task.layouts == {"f": LAYOUT}
    assert engine.open is not None and engine.open.selected == ["a", "b"]
    announcement = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert announcement.layouts == {"f": LAYOUT}
