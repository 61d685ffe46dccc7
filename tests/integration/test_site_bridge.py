"""A root coordinator on one Mosquitto, a site broker bridged to it, one site aggregator and two agents at the site:
agents' updates stay on the site broker, the site's partial aggregates cross the bridge, and rounds complete."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec, ManagedProcess, as_flags
from protocol.partials import PartialAggregate
from protocol.topics import Topics
from tests.integration.wire import WireRecorder, assert_all_completed, decode_wire, wait_for_rounds

pytestmark = pytest.mark.integration

FEDERATION = "sites"
ROUNDS = 2


def bridge_settings(root: MosquittoBroker) -> str:
    """deploy/mosquitto/site-bridge.conf's topics, pointed at ``root``."""
    f = f"fl/{FEDERATION}"
    return "\n".join([
        "connection root", f"address {root.host}:{root.port}", "remote_clientid site-s1-bridge",
        "cleansession false", "try_private true", "restart_timeout 1 5",
        f"topic {f}/coordinator/status in 1", f"topic {f}/rounds/current in 1", f"topic {f}/task in 1",
        f"topic {f}/global/# in 1", f"topic {f}/notices/# in 1",
        f"topic {f}/agents/+/status out 1", f"topic {f}/sites/+/partials/# out 1",
    ])


def test_two_rounds_through_a_site_aggregator_behind_a_bridge(tmp_path: Path, mosquitto: MosquittoBroker,
                                                              recorder: WireRecorder) -> None:
    site_broker = MosquittoBroker(workdir=tmp_path / "site-broker", settings=bridge_settings(mosquitto)).start()
    agents = [AgentSpec("rpi-1", "rpi", 0), AgentSpec("rpi-2", "rpi", 1)]
    fleet = Fleet(tmp_path / "run", site_broker.url, FleetSpec(agents=agents, alpha=1.0), {
        "broker_url": mosquitto.url, "rounds": ROUNDS, "min_available_agents": 2, "min_fit_agents": 2,
        "local_epochs": 1, "round_deadline_s": 120}, federation=FEDERATION)
    coordinator_dir = fleet.coordinator_dir
    site_dir = tmp_path / "run" / "sites"
    site = ManagedProcess("site", [sys.executable, "-m", "coordinator", "site", *as_flags({
        "federation": FEDERATION, "broker_url": site_broker.url, "site_id": "s1", "state_dir": site_dir / "state",
        "enrolled_agents_file": coordinator_dir / "enrolled.json", "signing_key_file": site_dir / "s1" / "agent_key.pem",
        "coordinator_key": site_dir / "s1" / "coordinator.pub", "task": fleet.coordinator_settings["task"],
        "min_available_agents": 2, "min_fit_agents": 2})], site_dir / "site.log")
    try:
        fleet.start_coordinator()
        done = subprocess.run([sys.executable, "-m", "coordinator", "enroll", "s1", "--state-dir", str(coordinator_dir),
                               "--bundle-dir", str(site_dir)], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        site.start()
        fleet.start_agents()
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 240)
    finally:
        fleet.stop()
        site.terminate()
        site_broker.stop()
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == 2 and r["sites"]["s1"]["accepted"] == 2 for r in rounds), rounds
    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]
    assert not [m.topic for parsed, m in seen if parsed.kind == "update"], "updates crossed the bridge"
    partials = [decode_wire(m.payload, PartialAggregate) for parsed, m in seen if parsed.kind == "partial"]
    assert sorted(p.round for p in partials) == list(range(1, ROUNDS + 2))
    assert all(p.site_id == "s1" and set(p.outcomes) == {"rpi-1", "rpi-2"} for p in partials)
