"""A flood from senders nobody enrolled does not starve the honest agents (coordinator/app/gate.py, inbox.py).

An open broker (no ACL: anyone may publish anywhere, and its queue for the coordinator is not
capped, so the whole flood reaches it), the coordinator with enrollment required, three enrolled
phone agents. Once round 2 is announced a separate process (bench/flooder.py) publishes
statuses and updates, each on a new made-up agent's topic and signed with one of 50
keys nobody enrolled, until the run's last round has closed (a few thousand at least). Every
round still gets every agent's update and completes, and every flood message is counted as
received and rejected (``unknown_signer``), none as a sender's backlog.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec
from tests.chart import REPO
from tests.integration.chaos import WireView, small_fleet
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

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

FEDERATION = "flooded"
ROUNDS = 6
FLOOD = 4000
AGENTS = [AgentSpec(f"phone-{i}", "phone", i) for i in range(3)]
UNCAPPED = "max_queued_messages 0\nmax_inflight_messages 1000\n"


def test_a_flood_from_unenrolled_senders_is_counted_and_no_round_misses_its_quorum(tmp_path: Path) -> None:
    with MosquittoBroker(workdir=tmp_path / "broker", settings=UNCAPPED) as broker:
        fleet = small_fleet(tmp_path / "run", broker.url, FEDERATION, AGENTS, {
            "rounds": ROUNDS, "round_deadline_s": 60, "quorum_fraction": 1.0, "local_epochs": 10,
            "enrollment": "required"})
        port = fleet.http_port
        # Connected first, it starts on "go" and stops once it sent FLOOD messages and its stdin is closed.
        flooder = subprocess.Popen(
            [sys.executable, str(REPO / "bench" / "flooder.py"), "--url", broker.url, "--federation", FEDERATION,
             "--count", str(FLOOD), "--keys", "50", "--rate", "2000", "--updates", "0.2", "--stdin"],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with WireRecorder(broker.url, f"fl/{FEDERATION}/rounds/current") as recorder, fleet:
                WireView(recorder, FEDERATION).wait_announced(2, 180)
                assert flooder.stdin is not None
                flooder.stdin.write("go\n")
                flooder.stdin.flush()
                closed_at_start = len(read_rounds(fleet.rounds_path))
                rounds = wait_for_rounds(fleet, ROUNDS + 1, 300)  # flooded from round 2 to the last
                out, err = flooder.communicate(timeout=300)
                assert flooder.returncode == 0, out + err
                sent = json.loads(out.strip().splitlines()[-1])

                def rejected(kind: str) -> float:
                    return metric(scrape(port), "fl_messages_rejected_total", kind=kind, reason="unknown_signer")

                wait_until(lambda: rejected("agent_status") >= sent["statuses"] and rejected("update") >= sent["updates"],
                           120, "every flood message counted")
                samples = scrape(port)
                assert_agents_exit_cleanly(fleet, 60)  # they exit once the run is finished
        finally:
            if flooder.poll() is None:
                flooder.kill()
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert closed_at_start < ROUNDS and sent["statuses"] + sent["updates"] >= FLOOD and sent["updates"] > 0, sent
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == r["selected"] == len(AGENTS) for r in rounds), rounds
    # Counted as received and rejected, like the intake counts what it refuses; never as a sender's backlog.
    assert metric(samples, "fl_received_messages_total", kind="agent_status") >= sent["statuses"]
    assert metric(samples, "fl_received_messages_total", kind="update") >= sent["updates"]
    assert metric(samples, "fl_updates_total", outcome="rejected") >= sent["updates"]
    for kind in ("agent_status", "update"):
        assert metric(samples, "fl_messages_rejected_total", kind=kind, reason="sender_backlog") == 0
