"""A coordinator waiting for agents names whom it waits for: a few ids, each with why, the rest counted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from coordinator.fleet.agents import AgentRegistry
from coordinator.fleet.enrollment import enroll
from coordinator.fleet.waiting import not_available
from protocol.messages import AgentStatus, PrivacySpent
from protocol.security.signing import SigningKey
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, Clock, hello, make_engine


def status(agent_id: str, state: str = "online", **fields: object) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state=state, device="rpi", family="f", num_samples=1,  # type: ignore[arg-type]
                       num_eval_samples=1, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT, **fields)


def test_each_missing_agent_is_named_with_why() -> None:
    registry = AgentRegistry(timeout_s=10.0)
    registry.observe(status("ready"), 100.0)
    registry.observe(status("gone", "offline"), 100.0)
    registry.observe(status("quiet"), 50.0)  # not heard for 50 s
    registry.observe(status("spent", "budget_exhausted", privacy=PrivacySpent(epsilon=3.0, delta=1e-5,
                                                                               exhausted=True)), 100.0)
    registry.observe(status("picky", problem="task other@1 is not this agent's"), 100.0)
    registry.observe(status("denied", denied=4), 100.0)
    line = not_available(registry, ["ready", "never"], ["ready", "denied"], 100.0, named=10)
    assert line == ("; not available: gone (offline), never (never seen), picky (refuses the rounds), "
                    "quiet (silent), spent (budget exhausted)")
    registry.observe(status("denied", "offline", denied=4), 100.0)
    assert "denied (offline, broker refused 4)" in not_available(registry, [], ["ready"], 100.0)


def test_the_list_is_bounded() -> None:
    registry = AgentRegistry(timeout_s=10.0)
    enrolled = [f"rpi-{i:03d}" for i in range(40)]
    line = not_available(registry, enrolled, [], 0.0)
    assert line == ("; not available: rpi-000 (never seen), rpi-001 (never seen), rpi-002 (never seen), "
                    "rpi-003 (never seen), rpi-004 (never seen) and 35 more")
    assert not_available(registry, enrolled, enrolled, 0.0) == ""


def test_the_waiting_line_names_enrolled_agents_not_seen(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    state.mkdir()
    for agent_id in ("phone-2", "rpi-1", "rpi-9"):
        enroll(state / "enrolled.json", agent_id, SigningKey.generate().public_key)
    engine, _, _ = make_engine(tmp_path, Clock(), enrollment="required", min_available_agents=3)
    assert engine.engine.parts.enrollment is not None
    with caplog.at_level(logging.INFO, logger="coordinator.round.engine"):
        engine.tick()
    waiting = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for agents")]
    assert waiting == ["waiting for agents: 0 online, 3 needed; not available: phone-2 (never seen), "
                       "rpi-1 (never seen), rpi-9 (never seen)"]


def test_with_open_enrollment_the_agents_heard_from_are_named(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    engine, _, _ = make_engine(tmp_path, Clock(), min_available_agents=3)
    hello(engine, "rpi-1")
    hello(engine, "rpi-2")
    with caplog.at_level(logging.INFO, logger="coordinator.round.engine"):
        engine.tick()
    assert "waiting for agents: 2 online, 3 needed" in caplog.text  # nobody known is missing: no list
    assert "not available" not in caplog.text


def test_a_fleet_coming_online_is_scanned_once_not_once_per_status(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every status ticks the engine; before a quorum is online nothing may look at every agent's status (a fleet
    of 4,000 coming online spent 9 s of the loop in those scans before round 1). Counted, not timed."""
    agents = 120
    engine, outbox, _ = make_engine(tmp_path, Clock(), min_available_agents=agents, min_fit_agents=agents)
    task = engine.engine.parts.task
    calls = 0
    real = task.status_problem

    def counting(status: AgentStatus) -> str | None:
        nonlocal calls
        calls += 1
        return real(status)

    monkeypatch.setattr(task, "status_problem", counting)
    for i in range(agents):
        hello(engine, f"rpi-{i:03d}")
        engine.tick()
        assert engine.engine.run.open is None or i == agents - 1
    assert engine.engine.run.open is not None and len(engine.engine.run.open.announcement.selected) == agents
    assert calls <= 3 * agents  # one scan of the fleet once it is all online; a scan per status made it 7,500
