"""A root coordinator on one Mosquitto, a site broker bridged to it, one site aggregator and two agents at the site:
agents' updates and statuses stay on the site broker, the site's roster and partial aggregates cross the bridge,
and rounds complete: under FedAvg, under SCAFFOLD, whose control deltas the site sums beside the deltas, and under
FedProto, whose prototypes it sums per class."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import GlobalState
from protocol.partials import PartialAggregate
from protocol.site_rosters import SiteRoster
from protocol.topics import Topics
from tests.integration.sites import bridge_settings, enroll_site, site_process
from tests.integration.wire import WireRecorder, assert_all_completed, decode_wire, metric, scrape, wait_for_rounds

pytestmark = pytest.mark.integration

FEDERATION = "sites"
ROUNDS = 2


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedproto"])
def test_two_rounds_through_a_site_aggregator_behind_a_bridge(tmp_path: Path, mosquitto: MosquittoBroker,
                                                              recorder: WireRecorder, algorithm: str) -> None:
    site_broker = MosquittoBroker(workdir=tmp_path / "site-broker",
                                  settings=bridge_settings(mosquitto, FEDERATION)).start()
    agents = [AgentSpec("rpi-1", "rpi", 0), AgentSpec("rpi-2", "rpi", 1)]
    fleet = Fleet(tmp_path / "run", site_broker.url, FleetSpec(agents=agents, alpha=1.0), {
        "broker_url": mosquitto.url, "rounds": ROUNDS, "min_available_agents": 2, "min_fit_agents": 2,
        "local_epochs": 1, "round_deadline_s": 120, "algorithm": algorithm}, federation=FEDERATION)
    site_dir = tmp_path / "run" / "sites"
    http_port = free_port()
    site = site_process(fleet, site_broker, "s1", site_dir, http_port=http_port)
    try:
        fleet.start_coordinator()
        enroll_site(fleet, "s1", site_dir)
        site.start()
        fleet.start_agents()
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 240)
        samples = scrape(http_port)  # the site's own /metrics and probes
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=5) as response:
            assert response.status == 200 and response.read() == b"ready\n"
    finally:
        fleet.stop()
        site.terminate()
        site_broker.stop()
    assert_all_completed(rounds, ROUNDS + 1)
    # Its agents' updates, every round: counted at the site, where they stayed.
    assert metric(samples, "fl_updates_total", outcome="accepted") == 2 * (ROUNDS + 1), samples
    assert all(r["answered"] == 2 and r["sites"]["s1"]["accepted"] == 2 for r in rounds), rounds
    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]
    assert not [m.topic for parsed, m in seen if parsed.kind == "update"], "updates crossed the bridge"
    assert not [m.topic for parsed, m in seen if parsed.kind == "agent_status"], "statuses crossed the bridge"
    rosters = [decode_wire(m.payload, SiteRoster) for parsed, m in seen if parsed.kind == "site_roster"]
    assert rosters and all(r.site_id == "s1" for r in rosters)
    assert [r.seq for r in rosters] == sorted(r.seq for r in rosters), "rosters out of order"
    assert {s.agent_id for r in rosters for s in r.statuses} == {"rpi-1", "rpi-2"}  # the root selected by these
    partials = [decode_wire(m.payload, PartialAggregate) for parsed, m in seen if parsed.kind == "partial"]
    assert sorted(p.round for p in partials) == list(range(1, ROUNDS + 2))
    assert all(p.site_id == "s1" and set(p.outcomes) == {"rpi-1", "rpi-2"} for p in partials)
    states = [decode_wire(m.payload, GlobalState) for parsed, m in seen if parsed.kind == "global_state" and m.payload]
    if algorithm == "fedproto":  # every training round sends prototypes (no bootstrap), per family
        trained = [p for p in partials if p.prototype_sums is not None]
        assert sorted(p.round for p in trained) == list(range(1, ROUNDS + 1)) and not any(p.sums for p in partials)
        assert all(int(p.prototype_counts.sum()) > 0 for p in trained)  # type: ignore[union-attr]
        assert {st.round for st in states if st.prototypes is not None} >= {2, ROUNDS + 1}
        return
    trained = [p for p in partials if p.sums]  # the delta rounds (round 1 bootstraps, the last one evaluates)
    assert len(trained) == ROUNDS - 1
    assert all(bool(p.control_sums) == (algorithm == "scaffold") for p in trained)
    moved = [st for st in states if st.round > 2]
    assert moved and all(bool(st.control) == (algorithm == "scaffold") for st in moved)
    if algorithm == "scaffold":  # the server variate took the site's sums
        assert any(float(abs(a).max()) > 0 for st in moved for a in st.control.values())
