"""Chaos: in each of 5 rounds, 30% of the agents are SIGKILLed mid-round and restarted at once.

Every agent takes 2 s longer than its training (simulated phone and Pi speed), so a kill
right after the announcement always lands before the victim answered. The restarted process
sees the round in progress, skips it (the coordinator counted it as dropped) and rejoins at
the next round; the round itself closes at its deadline with the other 70%.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import default_fleet
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
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

FEDERATION = "chaos-agents"
AGENTS = 10
VICTIMS = 3  # 30%
ROUNDS = 5
DEADLINE_S = 15.0


def test_thirty_percent_of_agents_killed_every_round(tmp_path: Path, mosquitto: MosquittoBroker,
                                                     recorder: WireRecorder) -> None:
    fleet = small_fleet(tmp_path / "run", mosquitto.url, FEDERATION, default_fleet(AGENTS, CHEAP_DEVICES), {
        "rounds": ROUNDS, "round_deadline_s": DEADLINE_S,
    }, {"straggler_delay": "constant:2"})
    wire = WireView(recorder, FEDERATION)
    killed: dict[int, list[str]] = {}
    with fleet:
        for number in range(1, ROUNDS + 1):
            announced = wire.wait_announced(number, timeout_s=120)
            selected = sorted(announced.announcement.selected)
            assert len(selected) == AGENTS, f"round {number} selected {selected}"
            start = (VICTIMS * (number - 1)) % AGENTS
            victims = [selected[(start + i) % AGENTS] for i in range(VICTIMS)]
            for name in victims:
                fleet.kill_agent(name)
            for name in victims:
                fleet.agents[name].start()  # a reboot: same state dir, new process
            killed[number] = victims
        rounds = wait_for_rounds(fleet, ROUNDS + 1, timeout_s=150)
        samples = scrape(fleet.http_port)
        updates = wire.updates()

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
