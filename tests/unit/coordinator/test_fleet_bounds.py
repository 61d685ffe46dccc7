"""No crash at any fleet size: rounds name at most what an announcement may carry, and the
registry of agents is bounded however many ids appear."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.fleet.agents import AgentRegistry, RegistryFull
from coordinator.fleet.selection import plan_selection
from protocol.messages import MAX_AGENTS_PER_ROUND, AgentStatus, RoundAnnouncement
from protocol.wire import decode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, hello, make_engine


def status(agent_id: str) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state="online", device="rpi", family="f", num_samples=1,
                       num_eval_samples=1, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT)


def test_selection_never_exceeds_the_maximum() -> None:
    pool = [f"a{i:05d}" for i in range(MAX_AGENTS_PER_ROUND + 2_000)]
    plan = plan_selection(pool, 1, seed=0, fraction=1.0, minimum=1, over_selection=0.5)
    assert len(plan.selected) == MAX_AGENTS_PER_ROUND and plan.wanted == MAX_AGENTS_PER_ROUND
    small = plan_selection(pool[:50], 1, seed=0, fraction=0.5, minimum=1, over_selection=1.0, maximum=30)
    assert (len(small.selected), small.wanted) == (30, 25)
    with pytest.raises(ValueError, match="maximum"):
        plan_selection(pool, 1, seed=0, fraction=1.0, minimum=1, maximum=MAX_AGENTS_PER_ROUND + 1)


@pytest.mark.parametrize("task", ["train", "evaluate"])
def test_more_agents_online_than_one_round_may_name(tmp_path: Path, task: str) -> None:
    """10,001 agents online used to make the (evaluation) announcement fail validation and kill the process."""
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock, rounds=1, max_agents_per_round=500,
                                    evaluate_final=True)
    if task == "evaluate":
        engine.run.next_round = 2  # past the last training round: the final evaluation
    for i in range(MAX_AGENTS_PER_ROUND + 1):
        hello(engine, f"a{i:05d}")
    engine.tick()
    assert engine.open is not None and engine.open.announcement.task == task
    announcement = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert len(announcement.selected) == 500
    assert set(announcement.selected) <= {f"a{i:05d}" for i in range(MAX_AGENTS_PER_ROUND + 1)}


def test_registry_forgets_the_longest_silent_agent_when_full() -> None:
    registry = AgentRegistry(timeout_s=10.0, capacity=3)
    for i, now in enumerate((0.0, 1.0, 2.0)):
        registry.observe(status(f"a{i}"), now)
    registry.observe(status("a0"), 20.0)  # heard again: now the most recent
    registry.observe(status("new"), 20.5)  # a1 was silent longest (since 1.0): forgotten
    assert registry.get("a1") is None and registry.get("new") is not None
    assert len(registry.count_by_family().values()) == 1 and registry.count_by_family()["f"] == 3


def test_registry_refuses_newcomers_while_every_known_agent_is_live() -> None:
    registry = AgentRegistry(timeout_s=10.0, capacity=2)
    registry.observe(status("a0"), 0.0)
    registry.observe(status("a1"), 1.0)
    with pytest.raises(RegistryFull):
        registry.observe(status("intruder"), 5.0)
    assert registry.get("intruder") is None
    registry.observe(status("a0"), 5.0)  # known agents are still heard


def test_a_flood_of_made_up_ids_is_counted_not_kept(tmp_path: Path) -> None:
    engine, _, metrics = make_engine(tmp_path, Clock(), max_known_agents=100)
    for i in range(1_000):
        hello(engine, f"x{i:04d}")
    assert sum(engine.parts.registry.count_by_family().values()) == 100
    refused = metrics.registry.get_sample_value("fl_messages_rejected_total",
                                                {"kind": "agent_status", "reason": "registry_full"})
    assert refused == 900
