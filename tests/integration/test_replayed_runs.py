"""Freshness on a live federation: an earlier run's genuine messages, replayed during a later run, change nothing.

Run A (three enrolled phones, the tiny model family, four rounds) is recorded from the open broker. Run B
starts with a new coordinator state directory but the SAME coordinator key, and the same enrolled agents,
started with --exit-when-finished as the launcher and the systemd unit run them. Then, as anyone on the
broker could:

* at B's start, run A's signed global states of rounds 3 and 4 are published again, retained (once, this
  pushed B's own states out of the agents' newest two, and every round from 2 on missed its quorum);
* while B is in round 3, run A's last announcement and its signed "finished" status (retained) are
  published again (once, every agent exited and round 3 missed its quorum), and so is one agent's last
  status of run A (which would have marked it offline at the coordinator).

Every signature verifies: what stops them is the run's epoch (agents) and the agents' (epoch, seq)
(coordinator). Run B completes every round with every agent, and the replays are counted as dropped.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import AgentStatus, CoordinatorStatus, GlobalState, RoundAnnouncement
from protocol.topics import Topics
from tests.integration.chaos import WireView
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    metric,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

FEDERATION = "replayed"
TOPICS = Topics(FEDERATION)
ROUNDS = 4
AGENTS = [AgentSpec(f"phone-{i}", "phone", i) for i in range(3)]
FAMILY = "mlp_tiny"
"""The digits task's family of phones: the tiny one."""


def fleet_of(run_dir: Path, url: str, coordinator: dict[str, object], agents: dict[str, object]) -> Fleet:
    spec = FleetSpec(agents=AGENTS, alpha=1.0, agent_settings={"reconnect_min_s": 0.2, "reconnect_max_s": 2.0,
                                                                **agents})
    return Fleet(run_dir, url, spec, {
        "rounds": ROUNDS, "min_available_agents": len(AGENTS), "min_fit_agents": len(AGENTS), "local_epochs": 1,
        "round_deadline_s": 30.0, **coordinator}, federation=FEDERATION)


def replay(url: str, messages: list[tuple[str, bytes, bool]]) -> None:
    """Publish captured payloads again, byte for byte, acknowledged (QoS 1): what anyone on the broker can do."""
    host, port = url.split("://")[1].split(":")
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="replayer",
                         protocol=paho.MQTTv311)
    client.connect(host, int(port))
    client.loop_start()
    try:
        for topic, payload, retain in messages:
            info = client.publish(topic, payload, qos=1, retain=retain)
            info.wait_for_publish(30)
            assert info.is_published(), topic
    finally:
        client.loop_stop()
        client.disconnect()


def test_an_earlier_runs_genuine_messages_replayed_change_nothing(tmp_path: Path, mosquitto: MosquittoBroker,
                                                                  recorder: WireRecorder) -> None:
    wire = WireView(recorder, FEDERATION)
    run_dir = tmp_path / "run"

    # -- run A, recorded --------------------------------------------------------------------
    run_a = fleet_of(run_dir, mosquitto.url, {}, {})
    with run_a:
        wait_for_rounds(run_a, ROUNDS + 1, 240)
        assert_agents_exit_cleanly(run_a, 60)
    seen = recorder.snapshot(lambda m: bool(m.payload))
    a_id = next(s.run_id for _, s in wire.coordinator_statuses() if s.state == "finished")
    finished = [m.payload for m in seen if m.topic == TOPICS.coordinator_status
                and decode_wire(m.payload, CoordinatorStatus).state == "finished"][-1]
    last_round = [m.payload for m in seen if m.topic == TOPICS.rounds_current][-1]
    assert decode_wire(last_round, RoundAnnouncement).run_id == a_id
    states = {n: [m.payload for m in seen if m.topic == TOPICS.global_state(FAMILY, n)][-1] for n in (3, 4)}
    assert all(decode_wire(p, GlobalState).run_id == a_id for p in states.values())
    agent_a_status = [m.payload for m in seen if m.topic == TOPICS.agent_status("phone-0")][-1]
    assert decode_wire(agent_a_status, AgentStatus).state == "offline"

    # -- run B: a new state directory, the same coordinator key, the same enrolled agents ----
    b_dir = run_dir / "coordinator-b"
    port = free_port()
    run_b = fleet_of(run_dir, mosquitto.url, {
        "state_dir": b_dir, "signing_key_file": run_a.coordinator_dir / "coordinator_key.pem",
        "http_port": port, "exit_when_finished": False,  # stays up for /metrics; stopped below
    }, {"straggler_delay": "constant:2"})  # each answer held 2 s: round 3 is still open while the replays land
    run_b.coordinator.log_path = b_dir / "coordinator.log"
    try:
        run_b.start_coordinator()
        wait_until(lambda: any(s.run_id not in ("none", a_id) for _, s in wire.coordinator_statuses()), 60,
                   "run B's coordinator to say it is online")
        b_id = next(s.run_id for _, s in wire.coordinator_statuses() if s.run_id not in ("none", a_id))
        replay(mosquitto.url, [(TOPICS.global_state(FAMILY, n), p, True) for n, p in states.items()])
        run_b.start_agents()
        wait_until(lambda: any(a.announcement.run_id == b_id and a.announcement.round == 3
                               for a in wire.announcements()), 180, "run B's round 3")
        # B's coordinator is paused while they land: it cannot finish the run (nor publish its "finished", which
        # the agents exit on) before every agent was sent the replays, and the broker delivers in order.
        os.kill(run_b.coordinator.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        try:
            replay(mosquitto.url, [(TOPICS.rounds_current, last_round, True),
                                   (TOPICS.coordinator_status, finished, True),
                                   (TOPICS.agent_status("phone-0"), agent_a_status, True)])
        finally:
            os.kill(run_b.coordinator.pid, signal.SIGCONT)  # type: ignore[arg-type]
        rounds = wait_for_rounds(run_b, ROUNDS + 1, 300, path=b_dir / "rounds.jsonl")
        assert_agents_exit_cleanly(run_b, 60)  # once B finished, not before
        wait_until(lambda: metric(scrape(port), "fl_messages_rejected_total", kind="agent_status",
                                  reason="stale_status") >= 1, 30, "the replayed agent status counted")
    finally:
        run_b.stop()
    assert not run_b.failures(), [p.log_tail() for p in run_b.failures()]

    # Every round of B completed with every agent: none exited early, none missed a round.
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == r["selected"] == len(AGENTS) for r in rounds), rounds
    assert all(p.starts == 1 for p in run_b.agents.values())
    epochs = {s.run_id: s.epoch for _, s in wire.coordinator_statuses()}
    assert epochs[b_id] > epochs[a_id] > 0

    # Each agent dropped and counted the replays (A's two states, its last round, its "finished"), logged once.
    for name, process in run_b.agents.items():
        last = [s for _, s in wire.agent_statuses() if s.agent_id == name][-1]
        assert last.state == "offline" and last.rejected >= 4, (name, last.rejected)
        log = process.log_path.read_text(errors="replace")
        assert "stale_epoch" in log, process.log_tail(40)
