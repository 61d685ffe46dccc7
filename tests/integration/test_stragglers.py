"""Stragglers: two agents always take longer than the deadline (simulated slow devices).

Each training round closes at its deadline without them, counts them as stragglers (they
stay online, so not as dropouts), and aggregates the four others. Their updates arrive after
the round closed and are dropped and counted as late.

With over-selection (want 4 updates, ask all 6) the rounds do not even wait for the
deadline: they close as soon as the four fast agents answered.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec
from protocol.messages import GlobalState
from tests.integration.chaos import DEADLINE_MARGIN_S, WireView, round_figures, small_fleet, write_figures
from tests.integration.wire import (
    WireRecorder,
    assert_all_completed,
    decode_wire,
    metric,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

FEDERATION = "stragglers"
ROUNDS = 2
DEADLINE_S = 12.0
SLOW = {"straggler_delay": "constant:20"}  # always past the deadline


AGENTS = [AgentSpec("phone-0", "phone", 0), AgentSpec("rpi-1", "rpi", 1), AgentSpec("phone-2", "phone", 2),
          AgentSpec("rpi-3", "rpi", 3), AgentSpec("phone-slow", "phone", 4, SLOW),
          AgentSpec("rpi-slow", "rpi", 5, SLOW)]


def test_agents_slower_than_the_deadline_are_left_out_and_counted(tmp_path: Path, mosquitto: MosquittoBroker,
                                                                  recorder: WireRecorder) -> None:
    fleet = small_fleet(tmp_path / "run", mosquitto.url, FEDERATION, AGENTS, {
        "rounds": ROUNDS, "round_deadline_s": DEADLINE_S,
    })
    wire = WireView(recorder, FEDERATION)
    with fleet:
        started = time.monotonic()
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 180)
        # Round 1's late updates come 20 s after it opened, while round 2 or the evaluation is on.
        wait_until(lambda: metric(scrape(fleet.http_port), "fl_messages_rejected_total", kind="update",
                                  reason="late") >= 2,
                   max(1.0, 180 - (time.monotonic() - started)), "two late updates")
        samples = scrape(fleet.http_port)

    figures = round_figures(rounds) | {
        "stragglers_total": metric(samples, "fl_stragglers_total"),
        "late_updates_dropped": metric(samples, "fl_messages_rejected_total", kind="update", reason="late"),
    }
    write_figures(tmp_path, "stragglers", figures)

    assert_all_completed(rounds, ROUNDS + 1)
    for r in rounds[:ROUNDS]:
        assert (r["selected"], r["answered"], r["stragglers"], r["dropouts"]) == (6, 4, 2, 0), r
        # Waited for its deadline (the stragglers never answered), and not much longer.
        assert r["deadline_s"] <= r["duration_s"] <= r["deadline_s"] + DEADLINE_MARGIN_S, r
    # The evaluation is not slowed down, but a straggler still busy with round 2 may miss it too.
    evaluation = rounds[ROUNDS]
    assert evaluation["answered"] + evaluation["stragglers"] == 6 and evaluation["answered"] >= 4
    assert metric(samples, "fl_stragglers_total") == 2 * ROUNDS + evaluation["stragglers"]
    assert metric(samples, "fl_dropouts_total") == 0
    assert metric(samples, "fl_updates_total", outcome="accepted") == 4 * ROUNDS + evaluation["answered"]

    # The slow agents did send round 1, but only after it had closed.
    closed_1 = next(seen.at for seen in wire.announcements() if seen.announcement.round == 2)
    late = [(a, at) for a, n, at in wire.updates() if n == 1 and a.endswith("-slow")]
    assert {a for a, _ in late} == {"phone-slow", "rpi-slow"} and all(at > closed_1 for _, at in late)

    # Round 1 still aggregated the others: both families got a round-2 global state.
    states = [decode_wire(m.payload, GlobalState) for m in recorder.snapshot(
        lambda m: "/global/" in m.topic and bool(m.payload))]
    assert {(s.family, s.round) for s in states} >= {("mlp_tiny", 2), ("cnn_small", 2)}


def test_over_selection_closes_rounds_without_waiting_for_stragglers(tmp_path: Path,
                                                                   mosquitto: MosquittoBroker) -> None:
    deadline_s = 40.0  # far longer than the stragglers' 20 s: only over-selection can close rounds early
    fleet = small_fleet(tmp_path / "run", mosquitto.url, FEDERATION, AGENTS, {
        "rounds": ROUNDS, "round_deadline_s": deadline_s, "fraction_fit": 0.6,
        "over_selection": 0.5, "min_fit_agents": 1, "evaluate_final": False,
    })
    with fleet:
        rounds = wait_for_rounds(fleet, ROUNDS, timeout_s=180)
        samples = scrape(fleet.http_port)

    figures = round_figures(rounds) | {"surplus": [r["surplus"] for r in rounds]}
    write_figures(tmp_path, "over_selection", figures)
    assert_all_completed(rounds, ROUNDS)
    for r in rounds:
        # 4 wanted, 6 asked: closed on the fourth answer, the two slow ones left over, none waited for.
        assert (r["selected"], r["answered"], r["surplus"], r["stragglers"], r["dropouts"]) == (6, 4, 2, 0, 0), r
        assert r["duration_s"] < r["deadline_s"], r
    assert metric(samples, "fl_stragglers_total") == 0
