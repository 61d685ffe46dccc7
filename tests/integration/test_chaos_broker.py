"""Chaos: the broker stops mid-round and starts again on the same port; nobody is restarted.

With persistence (the realistic setup) Mosquitto keeps retained messages and the coordinator's
persistent session across the restart, so updates sent during the outage reach it. Without
persistence everything retained and queued is gone: the coordinator republishes its retained
state, sees that its session was lost and announces a new session, and agents resend.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import default_fleet
from protocol.messages import CoordinatorStatus, RoundAnnouncement
from tests.integration.chaos import CHEAP_DEVICES, WireView, round_figures, small_fleet, write_figures
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    metric,
    metric_total,
    retained_messages,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

AGENTS = 6
ROUNDS = 4
DEADLINE_S = 25.0
DOWN_S = 3.0
OUTAGE_ROUND = 2


@pytest.mark.parametrize("persistence", [True, False], ids=["persistent", "volatile"])
def test_broker_restart_mid_round(tmp_path: Path, persistence: bool) -> None:
    federation = f"chaos-broker-{'p' if persistence else 'v'}"
    with (MosquittoBroker(workdir=tmp_path / "broker", persistence=persistence) as broker,
          WireRecorder(broker.url, "fl/#") as recorder):
        fleet = small_fleet(tmp_path / "run", broker.url, federation, default_fleet(AGENTS, CHEAP_DEVICES), {
            "rounds": ROUNDS, "round_deadline_s": DEADLINE_S,
        }, {"straggler_delay": "constant:2"})
        http_port = fleet.http_port
        wire = WireView(recorder, federation)
        with fleet:
            pids = {p.name: p.pid for p in fleet.processes()}
            wire.wait_announced(OUTAGE_ROUND, timeout_s=120)
            time.sleep(0.5)  # agents are training or holding their update back
            broker.restart(down_s=DOWN_S)
            started, started_wall = time.monotonic(), time.time()

            def coordinator_back() -> bool:
                samples = scrape(http_port)
                return (metric(samples, "fl_broker_connected") == 1
                        and metric(samples, "fl_broker_reconnects_total") >= 1)

            # Polled every 0.1 s (and a scrape takes time on a busy machine): an upper bound.
            wait_until(coordinator_back, 60, "the coordinator to reconnect", interval_s=0.1)
            coordinator_after = time.monotonic() - started

            def agents_back() -> bool:
                return metric_total(scrape(http_port), "fl_agent_reconnects_total") >= AGENTS

            wait_until(agents_back, 60, "every agent to reconnect and report it", interval_s=0.1)
            agents_after = time.monotonic() - started
            rounds = wait_for_rounds(fleet, ROUNDS + 1, timeout_s=150)
            outage_round_closed_after = next(r["closed_at"] for r in rounds if r["round"] == OUTAGE_ROUND) - started_wall
            assert_agents_exit_cleanly(fleet, 60)
            samples = scrape(http_port)
            retained = retained_messages(broker.url, f"fl/{federation}/#")

    figures = round_figures(rounds) | {
        "persistence": persistence,
        "coordinator_reconnected_after_s": round(coordinator_after, 2),
        "all_agents_reconnected_after_s": round(agents_after, 2),
        "outage_round_closed_after_s": round(outage_round_closed_after, 2),
        "coordinator_sessions": len({s.session for _, s in wire.coordinator_statuses()}),
    }
    write_figures(tmp_path, f"chaos_broker_{'persistent' if persistence else 'volatile'}", figures)

    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 2))
    assert_all_completed(rounds, ROUNDS + 1)
    # Not one update lost to the outage: queued by paho and the broker, or resent to a new session.
    assert all(r["answered"] == r["selected"] == AGENTS for r in rounds), figures["per_round"]
    assert metric(samples, "fl_broker_reconnects_total") >= 1
    assert metric_total(samples, "fl_agent_reconnects_total") >= AGENTS
    assert {p.name: p.pid for p in fleet.processes()} == pids and all(p.starts == 1 for p in fleet.processes())
    # With the broker's session gone, the coordinator must have told agents so with a new session.
    assert figures["coordinator_sessions"] == (1 if persistence else 2)

    # The retained state a late joiner would find is the run's end, whatever the broker lost.
    topics = wire.topics
    assert decode_wire(retained[topics.coordinator_status], CoordinatorStatus).state == "finished"
    assert decode_wire(retained[topics.rounds_current], RoundAnnouncement).round == ROUNDS + 1
    assert sorted(t for t in retained if "/global/" in t) == sorted(
        topics.global_state(f, ROUNDS + 1) for f in ("mlp_tiny", "cnn_small"))
