"""Chaos: in each of 3 rounds, 30% of the agents are SIGKILLed mid-round and restarted at once.

The victims of a round are paused (SIGSTOP) before its announcement can reach them (the coordinator
is paused until they are), so no victim can answer before its kill, however slow the machine. The
restarted process sees the round in progress, skips it (the coordinator counted it as dropped) and
rejoins at the next round; the round itself closes at its deadline with the other 70%. Three rounds
kill nine of the ten agents once each (every round waits out its whole deadline: five took about 30 s more).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import Fleet, default_fleet
from tests.integration.chaos import (
    CHEAP_DEVICES,
    DEADLINE_MARGIN_S,
    WireView,
    round_figures,
    small_fleet,
    write_figures,
)
from tests.integration.wire import (
    WireRecorder,
    assert_all_completed,
    metric,
    metric_total,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

FEDERATION = "chaos-agents"
AGENTS = 10
VICTIMS = 3  # 30%
ROUNDS = 3
DEADLINE_S = 15.0


def victims_of(number: int, agents: list[str]) -> list[str]:
    """Three different agents each round (every agent is selected: the test asserts it)."""
    start = (VICTIMS * (number - 1)) % AGENTS
    return [agents[(start + i) % AGENTS] for i in range(VICTIMS)]


@contextmanager
def paused(pid: int | None) -> Iterator[None]:
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def answered(wire: WireView, agents: list[str], number: int) -> Callable[[], bool]:
    return lambda: {(name, number) for name in agents} <= {(a, r) for a, r, _ in wire.updates()}


def pause_agents(fleet: Fleet, names: list[str]) -> None:
    for name in names:
        os.kill(fleet.agents[name].pid, signal.SIGSTOP)  # type: ignore[arg-type]


def test_thirty_percent_of_agents_killed_every_round(tmp_path: Path, mosquitto: MosquittoBroker,
                                                     recorder: WireRecorder) -> None:
    fleet = small_fleet(tmp_path / "run", mosquitto.url, FEDERATION, default_fleet(AGENTS, CHEAP_DEVICES), {
        "rounds": ROUNDS, "round_deadline_s": DEADLINE_S,
    })
    names = sorted(fleet.agents)
    wire = WireView(recorder, FEDERATION)
    killed: dict[int, list[str]] = {}
    try:
        fleet.start_coordinator()
        wait_until(lambda: bool(wire.coordinator_statuses()), 120, "the coordinator's status")
        with paused(fleet.coordinator.pid):
            fleet.start_agents()
            first = set(victims_of(1, names))
            wait_until(lambda: first <= {s.agent_id for _, s in wire.agent_statuses() if s.state == "online"}, 120,
                       "round 1's victims online")
            pause_agents(fleet, sorted(first))
        for number in range(1, ROUNDS + 1):
            announced = wire.wait_announced(number, timeout_s=120)
            assert sorted(announced.announcement.selected) == names, f"round {number} selected too few"
            victims = victims_of(number, names)
            with paused(fleet.coordinator.pid):
                for name in victims:
                    fleet.kill_agent(name)  # paused since before the announcement: it never answered
                for name in victims:
                    fleet.agents[name].start()  # a reboot: same state dir, new process
                killed[number] = victims
                if number < ROUNDS:  # the next round's victims answer this one, then wait paused
                    following = victims_of(number + 1, names)
                    wait_until(answered(wire, following, number), 120,
                               f"round {number + 1}'s victims' answers to round {number}")
                    pause_agents(fleet, following)
        rounds = wait_for_rounds(fleet, ROUNDS + 1, timeout_s=150)
        samples = scrape(fleet.http_port)
        updates = wire.updates()
    finally:
        fleet.stop()

    figures = round_figures(rounds)
    figures["killed_per_round"] = killed
    write_figures(tmp_path, "chaos_agents", figures)

    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 2))
    assert_all_completed(rounds, ROUNDS + 1)
    for r in rounds[:ROUNDS]:
        assert r["selected"] == AGENTS
        # The victims went offline (their last will) without answering: dropouts, not stragglers.
        assert r["dropouts"] == VICTIMS, r
        assert r["answered"] + r["stragglers"] == AGENTS - VICTIMS, r
        assert r["answered"] >= r["quorum"], r
        assert r["duration_s"] <= r["deadline_s"] + DEADLINE_MARGIN_S, r
    assert rounds[-1]["task"] == "evaluate" and rounds[-1]["duration_s"] <= DEADLINE_S + DEADLINE_MARGIN_S

    # Restarted mid-round: never answers the round it was killed in, answers the next one.
    sent = {(agent, number) for agent, number, _ in updates}
    for number, victims in killed.items():
        for name in victims:
            assert (name, number) not in sent, f"{name} answered round {number} although killed in it"
            assert (name, number + 1) in sent, f"{name} did not rejoin at round {number + 1}"

    assert metric(samples, "fl_dropouts_total") == VICTIMS * ROUNDS
    assert metric(samples, "fl_rounds_total", outcome="completed") == ROUNDS + 1
    assert metric_total(samples, "fl_agent_restarts_total") == VICTIMS * ROUNDS
    assert all(fleet.agents[name].starts == 1 + sum(name in v for v in killed.values()) for name in fleet.agents)
