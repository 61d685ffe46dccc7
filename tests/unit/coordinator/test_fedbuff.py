"""Buffered asynchronous rounds (FedBuff) driven through the engine: fake clock, recording outbox."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.policies.fedbuff import FedBuffPolicy
from coordinator.settings import CoordinatorSettings
from protocol.messages import GlobalState, RoundAnnouncement
from protocol.wire import decode_message
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, rejected, send, update, weights


def announced(outbox) -> RoundAnnouncement:  # type: ignore[no-untyped-def]
    return decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)


def state(outbox, round_number: int) -> GlobalState:  # type: ignore[no-untyped-def]
    """Version ``round_number``'s state as published (later cleared from retention with an empty payload)."""
    topic = TOPICS.global_state("f", round_number)
    return decode_message([p for t, p, _ in outbox.sent if t == topic and p][-1], GlobalState)


def start(tmp_path: Path, agents: dict[str, str] | None = None, **overrides: object):  # type: ignore[no-untyped-def]
    """An async engine with ``agents`` (id: family; default a, b, c of family f) online and version 1 open."""
    clock = Clock()
    settings = {"mode": "async", "buffer_size": 2, "max_staleness": 2, "rounds": 6, "min_available_agents": 3,
                "min_fit_agents": 1, "max_norm_ratio": 0, **overrides}  # buffers of 2 hold no median norm
    engine, outbox, metrics = make_engine(tmp_path, clock, **settings)
    for agent, family in (agents or {"a": "f", "b": "f", "c": "f"}).items():
        hello(engine, agent, family=family)
    engine.tick()
    return engine, outbox, metrics, clock


def test_staleness_discounts_follow_the_exponent() -> None:
    policy = FedBuffPolicy(buffer_size=4, max_staleness=3, exponent=0.5)
    assert [round(policy.staleness_weight(s), 4) for s in range(4)] == [1.0, 0.7071, 0.5774, 0.5]
    assert FedBuffPolicy(4, 3, 0.0).staleness_weight(3) == 1.0


def test_async_needs_an_algorithm_whose_updates_can_be_stale() -> None:
    with pytest.raises(ValidationError, match="mode async runs fedavg or fedprox, not scaffold"):
        CoordinatorSettings(mode="async", algorithm="scaffold")
    with pytest.raises(ValidationError, match="over_selection has no effect with mode async"):
        CoordinatorSettings(mode="async", over_selection=0.5)


def test_every_agent_is_selected_and_a_version_closes_every_buffer_size_updates(tmp_path: Path) -> None:
    engine, outbox, _, _ = start(tmp_path)
    assert announced(outbox).selected == ["a", "b", "c"]
    send(engine, update(engine, "a", 1, weights=weights(2.0)))
    send(engine, update(engine, "b", 1, weights=weights(2.0)))  # a bootstrap takes the proposal both sent
    engine.tick()  # two of three answered: the buffer is full, version 1 closes without waiting for c
    assert engine.last_summary.outcome == "completed" and engine.last_summary.stragglers == 0
    engine.tick()
    assert announced(outbox).round == 2
    np.testing.assert_allclose(state(outbox, 2).weights["w"], 2.0)


def test_a_stale_update_is_folded_in_at_its_discount(tmp_path: Path) -> None:
    engine, outbox, metrics, _ = start(tmp_path, max_norm_ratio=0)  # the discount alone, no norm clipping
    send(engine, update(engine, "a", 1, weights=weights(1.0)))
    send(engine, update(engine, "b", 1, weights=weights(1.0)))
    engine.tick(), engine.tick()  # version 2 is open; c is still on version 1
    v2 = state(outbox, 2)  # version 1 bootstrapped the family: deltas start from version 2
    send(engine, update(engine, "a", 2, delta=weights(0.0)))
    send(engine, update(engine, "b", 2, delta=weights(0.0)))
    engine.tick(), engine.tick()  # version 3 open
    assert announced(outbox).round == 3
    from_v2 = update(engine, "c", 2, delta=weights(3.0)).model_copy(update={"base_digest": v2.digest})
    send(engine, from_v2)  # one version stale: weight 10 x 1/sqrt(2)
    send(engine, update(engine, "a", 3, delta=weights(0.0)))
    engine.tick(), engine.tick()
    expected = 3.0 * (10 / np.sqrt(2)) / (10 / np.sqrt(2) + 10)  # the normalised staleness-weighted mean
    np.testing.assert_allclose(state(outbox, 4).weights["w"] - state(outbox, 3).weights["w"], expected, rtol=1e-5)
    staleness = metrics.registry.get_sample_value("fl_update_staleness_versions_sum")
    assert staleness == 1.0 and rejected(metrics, "stale_base") == 0


def test_too_stale_and_wrong_base_updates_are_dropped_and_counted(tmp_path: Path) -> None:
    engine, outbox, metrics, _ = start(tmp_path, max_staleness=1)
    digests = {}
    for version in (1, 2, 3):
        first, second = ("a", "b") if version != 2 else ("b", "a")
        send(engine, update(engine, first, version))
        send(engine, update(engine, second, version))
        engine.tick(), engine.tick()
        digests[version + 1] = state(outbox, version + 1).digest
    assert announced(outbox).round == 4
    too_old = update(engine, "c", 2).model_copy(update={"base_digest": digests[2]})
    send(engine, too_old)
    assert rejected(metrics, "too_stale") == 1
    forged_base = update(engine, "c", 3).model_copy(update={"base_digest": "0" * 32})
    send(engine, forged_base)
    assert rejected(metrics, "stale_base") == 1
    send(engine, update(engine, "c", 3).model_copy(update={"base_digest": digests[3]}))  # one behind: accepted
    assert "c" in engine.open.updates and engine.open.updates["c"].round == 3


def test_a_second_update_of_an_agent_waits_for_the_next_buffer(tmp_path: Path) -> None:
    engine, outbox, metrics, _ = start(tmp_path, {"a": "f", "b": "f", "c": "f", "d": "f"}, buffer_size=3,
                                       min_available_agents=4)
    for agent in ("a", "b", "c"):
        send(engine, update(engine, agent, 1))
    engine.tick(), engine.tick()  # version 2 open
    v2 = state(outbox, 2).digest
    send(engine, update(engine, "a", 2))
    send(engine, update(engine, "d", 2))
    send(engine, update(engine, "d", 2))  # the same again: a duplicate
    assert rejected(metrics, "duplicate") == 1
    engine.tick(), engine.tick()
    assert engine.open.number == 2  # not full yet (2 of 3)
    send(engine, update(engine, "c", 2))
    engine.tick(), engine.tick()  # full: version 2 closes, version 3 opens
    assert engine.open.number == 3
    v3 = state(outbox, 3).digest
    send(engine, update(engine, "a", 3))
    late_from_v2 = update(engine, "b", 2).model_copy(update={"base_digest": v2})
    send(engine, late_from_v2)  # b trained from version 2 and is not in this buffer yet: admitted, one version stale
    send(engine, update(engine, "b", 3).model_copy(update={"base_digest": v3}))  # b again: deferred, not lost
    assert metrics.registry.get_sample_value("fl_updates_deferred_total") == 1
    assert engine.open.updates["b"].round == 2
    send(engine, update(engine, "c", 3))
    engine.tick(), engine.tick()  # version 3 closes with a, b (stale), c; version 4 opens and takes b's v3 update
    assert engine.open.number == 4 and engine.open.updates["b"].round == 3
    assert rejected(metrics, "deferred_overflow") == 0


def test_robust_rules_aggregate_the_buffer_with_staleness_weights(tmp_path: Path) -> None:
    engine, outbox, _, _ = start(tmp_path, aggregator="median", buffer_size=3)
    for agent in ("a", "b", "c"):
        send(engine, update(engine, agent, 1))
    engine.tick(), engine.tick()
    v2 = state(outbox, 2)
    send(engine, update(engine, "a", 2, delta=weights(1.0)))
    send(engine, update(engine, "b", 2, delta=weights(2.0)))
    send(engine, update(engine, "c", 2, delta=weights(100.0)))  # one outlier: the median ignores it
    engine.tick(), engine.tick()
    np.testing.assert_allclose(state(outbox, 3).weights["w"] - v2.weights["w"], 2.0, rtol=1e-6)


def test_a_restarted_coordinator_still_checks_stale_bases(tmp_path: Path) -> None:
    engine, outbox, metrics, clock = start(tmp_path)
    for version in (1, 2):
        send(engine, update(engine, "a", version))
        send(engine, update(engine, "b", version))
        engine.tick(), engine.tick()
    v2 = state(outbox, 2).digest
    engine.store.save("open_round", {"run_id": "other"})  # resume into a fresh round, not the open one
    restarted, outbox2, metrics2 = make_engine(tmp_path, clock, mode="async", buffer_size=2, max_norm_ratio=0, max_staleness=2,
                                               rounds=6, min_available_agents=3, min_fit_agents=1)
    for agent in ("a", "b", "c"):
        hello(restarted, agent)
    restarted.tick()
    assert restarted.open.number == 3 and restarted.parts.versions.digest("f", 2) == v2
    send(restarted, update(restarted, "c", 2).model_copy(update={"base_digest": v2}))  # one behind: known base
    assert "c" in restarted.open.updates and rejected(metrics2, "stale_base") == 0


def test_a_family_missing_from_a_buffer_keeps_its_stale_updates(tmp_path: Path) -> None:
    """Version 3 carries family g's state of version 2 unchanged (no g update in buffer 2): a g agent
    training from version 3 reports base round 3, and that base must still be known when it is stale."""
    engine, outbox, metrics, _ = start(tmp_path, {"a": "f", "b": "f", "g1": "g"})

    def of_g(round_number: int, **payload: object):  # type: ignore[no-untyped-def]
        ref = announced(outbox).states.get("g")
        fields = payload or ({"weights": weights(1.0)} if ref is None else {"delta": weights(0.5)})
        return update(engine, "g1", round_number, **fields).model_copy(
            update={"family": "g", "base_digest": ref.digest if ref else None})

    send(engine, update(engine, "a", 1))
    send(engine, of_g(1))
    engine.tick(), engine.tick()  # version 2: both families bootstrapped
    send(engine, update(engine, "a", 2))
    send(engine, update(engine, "b", 2))
    engine.tick(), engine.tick()  # version 3: only f moved; g's state is version 2's
    assert announced(outbox).round == 3
    from_v3 = of_g(3)
    send(engine, update(engine, "a", 3))
    send(engine, update(engine, "b", 3))
    engine.tick(), engine.tick()  # version 4 open: g1's work from version 3 is one version stale
    assert announced(outbox).round == 4
    send(engine, from_v3)
    assert rejected(metrics, "stale_base") == 0 and engine.open.updates["g1"].round == 3


def test_an_applied_update_replayed_later_counts_once_across_restarts(tmp_path: Path) -> None:
    """A genuine update of version 2, replayed verbatim while version 3 is open (within the staleness bound), and
    again after a restart: a duplicate both times, never a second weight in a buffer."""
    engine, outbox, metrics, clock = start(tmp_path)
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()  # version 2 open
    original = update(engine, "a", 2)
    send(engine, original), send(engine, update(engine, "b", 2))
    engine.tick(), engine.tick()  # version 3 open: version 2's updates were applied
    assert announced(outbox).round == 3
    send(engine, original)  # the replay: one version stale, its base known
    assert "a" not in engine.open.updates and rejected(metrics, "duplicate") == 1
    engine.store.save("open_round", {"run_id": "other"})  # resume into a fresh round, not the open one
    restarted, _, metrics2 = make_engine(tmp_path, clock, mode="async", buffer_size=2, max_norm_ratio=0, max_staleness=2, rounds=6,
                                         min_available_agents=3, min_fit_agents=1)
    for agent in ("a", "b", "c"):
        hello(restarted, agent)
    restarted.tick()
    send(restarted, original)
    assert "a" not in restarted.open.updates and rejected(metrics2, "duplicate") == 1
    send(restarted, update(restarted, "a", 3))  # its next, genuine update still counts
    assert "a" in restarted.open.updates
