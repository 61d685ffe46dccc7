"""Two devices configured with one agent id (credentials copied), over a real Mosquitto.

They knock each other off the broker (one client id) and both keep publishing statuses. The
coordinator sees a process that is not the agent's newest keep advancing its statuses: it counts
it, logs it and sends the id a signed `duplicate_agent_id` notice, once to each process, each
when its own status shows it connected (one client id: a notice reaches only the process connected
when it goes out); both processes log it. (Mosquitto 2.0.11
closes the older connection without an MQTT 5 DISCONNECT, so "session taken over", which the
link logs where a broker sends it, cannot be seen here.)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.error import URLError

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec, ManagedProcess
from protocol.messages import Notice
from protocol.topics import Topics
from tests.integration.wire import (
    WireRecorder,
    decode_wire,
    fleet_keys,
    metric,
    metric_total,
    scrape,
    signer_of,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FEDERATION = "twins"
TOPICS = Topics(FEDERATION)


def online(port: int) -> float:
    """Agents online at the coordinator; 0 before it serves /metrics."""
    try:
        return metric_total(scrape(port), "fl_agents_online")
    except URLError:
        return 0.0


def test_two_processes_with_one_agent_id_are_detected_and_both_told(tmp_path: Path, mosquitto: MosquittoBroker) -> None:
    port = free_port()
    # phone-2 is enrolled but never started: no round opens, so the run cannot end (and its agents exit) before the
    # twins are told. Telling them rests on statuses alone.
    agents = [AgentSpec("phone-0", "phone", 0), AgentSpec("phone-1", "phone", 1), AgentSpec("phone-2", "phone", 2)]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=1.0), {
        "rounds": 2, "min_available_agents": 3, "min_fit_agents": 3, "local_epochs": 1, "http_port": port,
        "exit_when_finished": False, "notice_interval_s": 3,
    }, federation=FEDERATION)
    twin_dir = tmp_path / "twin"
    with WireRecorder(mosquitto.url, TOPICS.notices("phone-0"), client_id="notice-recorder") as recorder:
        fleet.start_coordinator()
        for name in ("phone-0", "phone-1"):
            fleet.agents[name].start()
        wait_until(lambda: online(port) >= 2, 180, "both agents online")
        original = fleet.agents["phone-0"]
        twin_dir.mkdir()
        for name in ("agent_key.pem", "coordinator.pub"):  # the same identity copied onto a second device
            shutil.copy(fleet.agent_dir("phone-0") / name, twin_dir / name)
        argv = [str(twin_dir) if a == str(fleet.agent_dir("phone-0")) else
                str(twin_dir / Path(a).name) if a.startswith(str(fleet.agent_dir("phone-0"))) else a
                for a in original.argv]
        twin = ManagedProcess("phone-0-twin", argv, twin_dir / "agent.log", original.env).start()
        try:
            wait_until(lambda: metric(scrape(port), "fl_duplicate_agent_ids_total") >= 1, 120,
                       "the coordinator to see two live processes under phone-0")
            wait_until(lambda: any(m.payload for m in recorder.snapshot()), 60, "a notice to phone-0")
            told = "the coordinator refused its status: duplicate_agent_id"
            wait_until(lambda: told in original.log_path.read_text() and told in twin.log_path.read_text(),
                       180, "both processes to log the duplicate_agent_id notice")
            keys = fleet_keys(fleet)
        finally:
            twin.terminate()
            fleet.stop()
    assert not fleet.rounds_path.exists() or not fleet.rounds_path.read_text().strip()  # no round ever opened
    notices = [m for m in recorder.snapshot() if m.payload]
    assert all(signer_of(m.payload, keys) == "coordinator" for m in notices)
    reasons = {decode_wire(m.payload, Notice).reason for m in notices}
    assert "duplicate_agent_id" in reasons, reasons
    detail = next(decode_wire(m.payload, Notice).detail for m in notices
                  if decode_wire(m.payload, Notice).reason == "duplicate_agent_id")
    assert "two live processes use agent id phone-0" in detail
    coordinator_log = (fleet.coordinator_dir / "coordinator.log").read_text()
    assert "two live processes use agent id phone-0" in coordinator_log
