"""Chaos: the coordinator is SIGKILLed twice mid-round and restarted; the agents keep running.

Kill 1 lands right after round 2 is announced, before any agent answered: the agents answer
while it is down, the broker queues their updates in its persistent session, and the
restarted coordinator resumes round 2 from its files and receives them. Kill 2 lands after
some agents answered round 4: those updates died with the process, and the agents send them
again when the new coordinator session re-announces the round.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator.state.checkpoint import CheckpointStore
from coordinator.state.rounds_log import RoundsLog
from launcher.broker import MosquittoBroker
from launcher.fleet import Fleet, default_fleet
from tests.integration.chaos import CHEAP_DEVICES, WireView, round_figures, small_fleet, write_figures
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    metric,
    read_rounds,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

FEDERATION = "chaos-coordinator"
AGENTS = 8
ROUNDS = 5
DEADLINE_S = 25.0
DOWN_S = 2.0


def _crash_and_restart(fleet: Fleet, wire: WireView, round_number: int) -> dict[str, float]:
    """SIGKILL the coordinator, leave it down DOWN_S, start it again; time its recovery."""
    sessions_before = {status.session for _, status in wire.coordinator_statuses()}
    fleet.kill_coordinator()
    time.sleep(DOWN_S)
    restarted, restarted_wall = time.monotonic(), time.time()
    fleet.coordinator.start()

    def online_again() -> bool:
        return any(status.session not in sessions_before and status.state == "online"
                   for _, status in wire.coordinator_statuses())

    wait_until(online_again, 60, f"the restarted coordinator to come back online (round {round_number})")
    back = min(at for at, status in wire.coordinator_statuses()
               if status.session not in sessions_before and status.state == "online")
    wait_until(lambda: any(r["round"] == round_number for r in read_rounds(fleet.rounds_path)), 60,
               f"round {round_number} to close after the restart")
    closed = next(r for r in read_rounds(fleet.rounds_path) if r["round"] == round_number)
    return {"round": round_number, "online_after_s": round(back - restarted, 2),
            "round_closed_after_s": round(closed["closed_at"] - restarted_wall, 2)}


def test_coordinator_killed_twice_resumes_without_losing_rounds(tmp_path: Path, mosquitto: MosquittoBroker,
                                                                recorder: WireRecorder) -> None:
    fleet = small_fleet(tmp_path / "run", mosquitto.url, FEDERATION, default_fleet(AGENTS, CHEAP_DEVICES), {
        "rounds": ROUNDS, "round_deadline_s": DEADLINE_S,
    }, {"straggler_delay": "uniform:1,4"})
    wire = WireView(recorder, FEDERATION)
    recoveries = []
    with fleet:
        pids = {name: process.pid for name, process in fleet.agents.items()}
        wire.wait_announced(2, timeout_s=120)
        recoveries.append(_crash_and_restart(fleet, wire, 2))

        wire.wait_announced(4, timeout_s=120)
        wait_until(lambda: len({a for a, n, _ in wire.updates() if n == 4}) >= 3, 60, "3 answers to round 4")
        answered_before_kill = len({a for a, n, _ in wire.updates() if n == 4})
        recoveries.append(_crash_and_restart(fleet, wire, 4) | {"answers_before_kill": answered_before_kill})

        rounds = wait_for_rounds(fleet, ROUNDS + 1, timeout_s=150)
        assert_agents_exit_cleanly(fleet, 60)
        samples = scrape(fleet.http_port)

    figures = round_figures(rounds) | {"coordinator_restarts": recoveries,
                                       "duplicates_dropped_after_last_restart": metric(
                                           samples, "fl_messages_rejected_total", kind="update",
                                           reason="duplicate")}
    write_figures(tmp_path, "chaos_coordinator", figures)

    # Every round closed exactly once, in order, with every agent's update: nothing was lost.
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 2))
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == r["selected"] == AGENTS for r in rounds), figures["per_round"]

    # On the wire: round numbers never go back, and a re-announced round is the same announcement.
    announced = wire.announcements()
    numbers = [a.announcement.round for a in announced]
    assert numbers == sorted(numbers) and set(numbers) == set(range(1, ROUNDS + 2))
    for number in set(numbers):
        assert len({a.payload for a in announced if a.announcement.round == number}) == 1, number
    assert len({status.session for _, status in wire.coordinator_statuses()}) == 3

    # The checkpoint on disk is the finished run's; the rounds log holds every round once.
    checkpoint = CheckpointStore(fleet.coordinator_dir).load("checkpoint")
    assert checkpoint is not None and checkpoint["finished"] and checkpoint["next_round"] == ROUNDS + 2
    assert checkpoint["last_summary"]["round"] == ROUNDS + 1
    assert [s.round for s in RoundsLog(fleet.rounds_path).read()] == list(range(1, ROUNDS + 2))

    # The agents are the processes started at the beginning: none was restarted.
    assert fleet.coordinator.starts == 3
    assert all(p.starts == 1 and p.pid == pids[name] for name, p in fleet.agents.items())
