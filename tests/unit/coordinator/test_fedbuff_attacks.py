"""FedBuff against the threat model (found in review): a late joiner cannot overflow a robust rule's rows, a replay
between buffers cannot crowd out its agent's genuine update, buffers too small for a median norm are refused at
start-up, the carried median survives a restart (a lone delta is still clipped), and an agent whose privacy budget
is spent trains no more in async mode either."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from protocol.messages import PrivacySpent
from tests.unit.coordinator.test_engine import hello, make_engine, rejected, send, update, weights
from tests.unit.coordinator.test_fedbuff import start, state


def test_an_agent_that_joins_a_full_robust_buffer_waits_for_the_next_one(tmp_path: Path) -> None:
    """The rows of a robust rule hold as many updates as the buffer selected agents; a fourth one (an honest late
    joiner) used to raise out of the engine."""
    engine, _, metrics, _ = start(tmp_path, aggregator="median", buffer_size=3, max_norm_ratio=0)
    for agent in "abc":
        send(engine, update(engine, agent, 1))
    engine.tick(), engine.tick()
    assert engine.open.number == 2 and engine.open.selected == ["a", "b", "c"]
    hello(engine, "d")
    for agent in "abcd":
        send(engine, update(engine, agent, 2))  # d's arrives before the tick that closes the buffer
    assert [w.update.agent_id for w in engine.engine.run.deferred] == ["d"]
    engine.tick(), engine.tick()
    assert engine.last_summary.round == 2 and engine.last_summary.outcome == "completed"
    assert engine.open.number == 3 and "d" in engine.open.updates  # taken by the next buffer, stale by one
    assert rejected(metrics, "deferred_overflow") == 0


def test_a_replay_between_buffers_does_not_crowd_out_the_agents_genuine_update(tmp_path: Path) -> None:
    engine, _, metrics, _ = start(tmp_path)
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()
    captured = update(engine, "a", 2)
    send(engine, captured), send(engine, update(engine, "b", 2))
    engine.tick(), engine.tick()  # version 3 open: a's version-2 update applied
    genuine = update(engine, "a", 3)
    send(engine, update(engine, "b", 3)), send(engine, update(engine, "c", 3))
    engine.tick()  # version 3 closes; version 4 is not open yet
    assert engine.open is None
    send(engine, captured)  # replayed from the broker: refused now, not queued
    send(engine, genuine)
    assert rejected(metrics, "duplicate") == 1
    engine.tick()
    assert engine.open.number == 4 and engine.open.updates["a"].round == 3
    assert rejected(metrics, "deferred_overflow") == 0


def test_a_newer_update_replaces_its_agents_older_one_in_the_queue(tmp_path: Path) -> None:
    engine, _, metrics, _ = start(tmp_path)
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()
    send(engine, update(engine, "a", 2)), send(engine, update(engine, "b", 2))
    engine.tick()  # version 2 closes
    send(engine, update(engine, "c", 1, delta=weights(0.1)))  # c's stale work ...
    send(engine, update(engine, "c", 2, delta=weights(0.2)))  # ... then its newer work, both while none is open
    assert [(w.update.agent_id, w.update.round) for w in engine.engine.run.deferred] == [("c", 2)]
    assert rejected(metrics, "deferred_overflow") == 1  # the older is refused and counted: every update accounted
    assert rejected(metrics, "duplicate") == 0


@pytest.mark.parametrize("buffer_size", [1, 2])
def test_a_buffer_too_small_for_a_median_norm_is_refused_at_start_up(tmp_path: Path, buffer_size: int) -> None:
    with pytest.raises(ValidationError, match=f"buffer_size {buffer_size} with max_norm_ratio 1"):
        CoordinatorSettings(federation="t", state_dir=tmp_path, mode="async", buffer_size=buffer_size)
    CoordinatorSettings(federation="t", state_dir=tmp_path, mode="async", buffer_size=buffer_size, max_norm_ratio=0)


SETTINGS = {"mode": "async", "buffer_size": 3, "max_staleness": 2, "rounds": 8, "min_available_agents": 3,
            "min_fit_agents": 1, "quorum_fraction": 0.3, "max_norm_ratio": 1.0}


@pytest.mark.parametrize("restart", [False, True])
def test_a_lone_delta_is_clipped_by_the_carried_median_across_a_restart(tmp_path: Path, restart: bool) -> None:
    engine, outbox, _, clock = start(tmp_path, **SETTINGS)
    for agent in "abc":
        send(engine, update(engine, agent, 1, weights=weights(1.0)))
    engine.tick(), engine.tick()
    for agent in "abc":
        send(engine, update(engine, agent, 2, delta=weights(0.5)))
    engine.tick(), engine.tick()  # three deltas: their median is carried to later buffers
    if restart:
        engine.store.save("open_round", {"run_id": "other"})  # resume into a fresh version 3
        engine, outbox, _ = make_engine(tmp_path, clock, **SETTINGS)
        for agent in "abc":
            hello(engine, agent)
        engine.tick()
    assert engine.open.number == 3
    before = state(outbox, 3).weights["w"]
    send(engine, update(engine, "a", 3, delta=weights(1000.0)))  # alone in its buffer, which closes at the deadline
    clock.now += 11
    engine.tick(), engine.tick()
    assert np.max(np.abs(state(outbox, 4).weights["w"] - before)) <= 0.5 + 1e-4


def test_an_agent_whose_budget_is_spent_counts_in_no_later_buffer(tmp_path: Path) -> None:
    """Every available agent trains in async mode; one whose last update said its budget is spent is not available,
    and an update it sends anyway (a buggy or lying device) is refused, not folded."""
    engine, _, metrics, _ = start(tmp_path, agents=dict.fromkeys("abcd", "f"))
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()
    spent = PrivacySpent(epsilon=3.0, delta=1e-5, budget_epsilon=3.0, exhausted=True)
    send(engine, update(engine, "a", 2, privacy=spent))  # its last: counted
    assert "a" in engine.open.updates
    send(engine, update(engine, "c", 2))
    engine.tick(), engine.tick()
    assert engine.open.number == 3 and "a" not in engine.open.selected
    send(engine, update(engine, "a", 3, privacy=spent))
    assert "a" not in engine.open.updates and rejected(metrics, "unselected") == 1
