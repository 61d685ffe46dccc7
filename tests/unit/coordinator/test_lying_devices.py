"""An enrolled device lies about what it reports: its prototype counts, its SCAFFOLD control delta, its place in
FedBuff's queue, an empty status on its topic. Each lie is refused or bounded, never crashes the coordinator, and
no single device steers the model (the real engine, driven message by message: tests/unit/coordinator/
test_engine.py's harness)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator.app.driver import EngineDriver
from protocol.messages import GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.tasks import BUILTIN_CARDS
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, rejected, send, update, weights

CARD = BUILTIN_CARDS["digits"]


def current(engine: EngineDriver) -> RoundAnnouncement:
    return decode_message(engine.outbox.last(TOPICS.rounds_current), RoundAnnouncement)  # type: ignore[attr-defined]


def send_update(engine: EngineDriver, agent_id: str, samples: int = 10, **payload: object) -> None:
    ann = current(engine)
    ref = ann.states.get("f")
    message = Update(run_id=engine.run.run_id, agent_id=agent_id, round=ann.round, task="train", task_ref=DIGITS,
                     family="f", base_digest=ref.digest if ref else None, num_samples=samples,
                     metrics=TrainMetrics(), **payload)  # type: ignore[arg-type]
    engine.on_message(TOPICS.update(agent_id, ann.round), encode_message(message))


def counts(first: int) -> np.ndarray:
    return np.array([first] + [0] * (CARD.num_classes - 1), dtype=np.int64)


def test_prototype_counts_past_the_claimed_samples_are_refused_and_cannot_crash_the_merge(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock, algorithm="fedproto", min_available_agents=3,
                                          min_fit_agents=3)
    for agent_id in "abc":
        hello(engine, agent_id)
    engine.tick()
    honest = np.zeros((CARD.num_classes, CARD.embedding_dim), np.float32)
    honest[0, 0] = 1.0
    evil = np.zeros_like(honest)
    evil[0, 1] = 1.0
    send_update(engine, "a", prototypes=honest, prototype_counts=counts(10))
    send_update(engine, "b", prototypes=honest, prototype_counts=counts(10))
    send_update(engine, "c", prototypes=evil, prototype_counts=counts(10**12))  # 10 samples claimed
    send_update(engine, "c", prototypes=evil, prototype_counts=counts(2**63 - 1))  # overflowed the int64 totals
    assert rejected(metrics, "bad_counts") == 2
    clock.now += 600.0  # past the deadline: c never answered honestly
    engine.tick()
    for agent_id in "abc":  # still there: the next round opens and publishes the state
        hello(engine, agent_id)
    engine.tick()
    summary = engine.last_summary
    assert summary is not None and summary.outcome == "completed" and summary.answered == 2
    state = decode_message(outbox.last(TOPICS.global_state("f", 2)), GlobalState)
    assert state.prototypes is not None and state.prototypes[0, 0] == 1.0 and state.prototypes[0, 1] == 0.0


def test_one_devices_control_delta_is_clipped_to_the_rounds_median_norm(tmp_path: Path) -> None:
    engine, outbox, _ = make_engine(tmp_path, Clock(), algorithm="scaffold", min_available_agents=3, min_fit_agents=3)
    for agent_id in "abc":
        hello(engine, agent_id)
    engine.tick()
    zero = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    for agent_id in "abc":
        send_update(engine, agent_id, weights=weights(1.0), control_delta=zero)
    engine.tick(), engine.tick()
    honest = {"w": np.full((2, 3), 0.01, np.float32), "b": np.full(3, 0.01, np.float32)}
    evil = {"w": np.full((2, 3), 1e30, np.float32), "b": np.full(3, 1e30, np.float32)}
    send_update(engine, "a", delta=weights(0.01), control_delta=honest)
    send_update(engine, "b", delta=weights(0.01), control_delta=honest)
    send_update(engine, "c", delta=weights(0.01), control_delta=evil)  # a model delta like the others'
    engine.tick(), engine.tick()
    summary = engine.last_summary
    assert summary is not None and summary.round == 2 and summary.outcome == "completed"
    control = decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState).control
    assert float(np.abs(control["w"]).max()) <= 0.0101  # the mean of three control deltas, each within the median
    assert "c" in summary.clipped_norms


def test_fedbuff_defers_one_update_per_agent(tmp_path: Path) -> None:
    engine, _, metrics = make_engine(tmp_path, Clock(), mode="async", buffer_size=2, max_staleness=3, rounds=8,
                                     min_available_agents=3, min_fit_agents=1, max_norm_ratio=0)
    for agent_id in "abc":
        hello(engine, agent_id)
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()
    run = engine.engine.run
    buffered, run.open, run.next_round = run.open, None, 3  # as a buffer being aggregated leaves it
    for i in range(10):
        send(engine, update(engine, "c", 2, delta=weights(i * 1e-3)))  # checked only once taken: so one waits
    send(engine, update(engine, "b", 2, delta=weights(0.0)))
    run.open, run.next_round = buffered, 2
    assert [waiting.update.agent_id for waiting in run.deferred] == ["c", "b"]
    assert rejected(metrics, "deferred_overflow") == 9


def test_an_emptied_status_does_not_let_an_applied_update_count_again(tmp_path: Path) -> None:
    """Anyone may empty an agent's retained status (the agent is then forgotten); its update already applied in
    one FedBuff buffer, replayed after, is still a duplicate."""
    engine, _, metrics = make_engine(tmp_path, Clock(), mode="async", buffer_size=2, max_staleness=3, rounds=8,
                                     min_available_agents=3, min_fit_agents=1, max_norm_ratio=0)
    for agent_id in "abc":
        hello(engine, agent_id)
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()
    captured = update(engine, "c", 2, delta=weights(5.0))
    send(engine, captured), send(engine, update(engine, "a", 2, delta=weights(0.0)))
    engine.tick(), engine.tick()
    assert engine.open is not None and engine.open.number == 3  # c's update applied in version 2's buffer
    engine.on_message(TOPICS.agent_status("c"), b"")  # unsigned: c is forgotten
    hello(engine, "c")  # its last signed status, replayed
    send(engine, captured)
    assert "c" not in engine.open.updates and rejected(metrics, "duplicate") == 1
