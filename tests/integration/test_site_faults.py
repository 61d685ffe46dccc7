"""Faults at a site, with real brokers and processes: a site aggregator killed mid-round and restarted, one signing
with a key the root never enrolled, and the bridge to the root cut and restored. Nothing lost, nothing counted twice."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec, ManagedProcess
from launcher.sites import wait_listening
from protocol.partials import PartialAggregate
from protocol.topics import Topics
from tests.integration.sites import TcpLink, bridge_settings, enroll_site, site_process, wait_for_log
from tests.integration.wire import (
    WireRecorder,
    assert_all_completed,
    decode_wire,
    metric,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = pytest.mark.integration

FEDERATION = "faults"
AGENTS = [AgentSpec("rpi-1", "rpi", 0), AgentSpec("rpi-2", "rpi", 1)]


def make_fleet(tmp_path: Path, site_broker: MosquittoBroker, root: MosquittoBroker, rounds: int,
               agent_settings: dict[str, object] | None = None, **settings: object) -> Fleet:
    spec = FleetSpec(agents=AGENTS, alpha=1.0, agent_settings=agent_settings or {})
    return Fleet(tmp_path / "run", site_broker.url, spec, {
        "broker_url": root.url, "rounds": rounds, "min_available_agents": 2, "min_fit_agents": 2,
        "local_epochs": 1, "round_deadline_s": 60, "evaluate_final": False, "http_port": free_port(), **settings},
        federation=FEDERATION)


def partials_on(recorder: WireRecorder) -> list[PartialAggregate]:
    topics = Topics(FEDERATION)
    return [decode_wire(m.payload, PartialAggregate) for m in recorder.snapshot()
            if topics.parse(m.topic).kind == "partial"]


def refused_partials(samples: dict) -> float:
    return sum(value for (name, labels), value in samples.items()
               if name == "fl_messages_rejected_total" and ("kind", "partial") in labels)


def assert_each_agent_once(rounds: list[dict]) -> None:
    """Every selected agent of every round accounted for exactly once: answered, rejected or straggling."""
    for r in rounds:
        assert r["answered"] + r["rejected"] + r["stragglers"] + r.get("dropouts", 0) == r["selected"], r


def test_a_site_aggregator_killed_mid_round_and_restarted_counts_its_agents_once(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    """Killed with its round open, before its agents answer; their updates wait in its persistent session on the
    site broker, and the restarted aggregator folds them into one partial: every agent counted, once.

    The order is forced, not timed: the root learns of the agents only from the site's roster, so while the
    aggregator is paused no round can open; the agents are paused once their statuses are at the site, the
    aggregator resumes (its roster goes up, the root opens round 1), and it is killed once the announcement is
    at the site, before the agents resume and answer."""
    site_broker = MosquittoBroker(workdir=tmp_path / "site-broker", persistence=True,
                                  settings=bridge_settings(mosquitto, FEDERATION)).start()
    fleet = make_fleet(tmp_path, site_broker, mosquitto, rounds=2)
    bundle = tmp_path / "run" / "sites"
    site = site_process(fleet, site_broker, "s1", bundle)
    at_site = WireRecorder(site_broker.url, f"fl/{FEDERATION}/#", client_id="site-wire").start()
    topics = Topics(FEDERATION)

    def at_site_of(kind: str, round_number: int | None = None) -> set[str]:
        """Senders of the non-empty messages of ``kind`` (of ``round_number``) seen on the site broker."""
        parsed = [(topics.parse(m.topic), m) for m in at_site.snapshot() if m.payload]
        return {p.agent_id or "" for p, m in parsed
                if p.kind == kind and (round_number is None or p.round == round_number)}

    paused: list[ManagedProcess] = []
    try:
        fleet.start_coordinator()
        enroll_site(fleet, "s1", bundle)
        site.start()
        wait_listening(site, site_broker.url, FEDERATION)
        paused.append(site)
        os.kill(site.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        fleet.start_agents()
        wait_until(lambda: at_site_of("agent_status") >= {"rpi-1", "rpi-2"}, 120, "both agents' statuses at the site")
        agents = [p for p in fleet.processes() if p is not fleet.coordinator]
        for process in agents:
            os.kill(process.pid, signal.SIGSTOP)  # type: ignore[arg-type]
            paused.append(process)
        os.kill(site.pid, signal.SIGCONT)  # type: ignore[arg-type]
        paused.remove(site)
        wait_until(lambda: any(topics.parse(m.topic).kind == "round" and m.payload for m in at_site.snapshot()),
                   120, "round 1 announced at the site")
        site.kill()  # SIGKILL: no clean disconnect; its session (and subscriptions) stay on the site broker
        for process in agents:
            os.kill(process.pid, signal.SIGCONT)  # type: ignore[arg-type]
            paused.remove(process)
        wait_until(lambda: at_site_of("update", 1) >= {"rpi-1", "rpi-2"}, 120,
                   "both agents' round 1 updates at the site broker")
        site.start()
        rounds = wait_for_rounds(fleet, 2, 180)
    finally:
        for process in paused:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(process.pid, signal.SIGCONT)  # type: ignore[arg-type]
        at_site.stop()
        fleet.stop()
        site.terminate()
        site_broker.stop()
    assert_all_completed(rounds, 2)
    assert_each_agent_once(rounds)
    assert [r["sites"]["s1"]["accepted"] for r in rounds] == [2, 2], rounds
    first = [p for p in partials_on(recorder) if p.round == 1]
    assert len(first) == 1 and {a for a, o in first[0].outcomes.items() if o.outcome == "accepted"} == \
        {"rpi-1", "rpi-2"}, first


def test_a_site_aggregator_signing_with_an_unenrolled_key_is_refused_and_counted(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    """A second aggregator at the site claims to be site s1 with a key the root never enrolled: its partials are
    refused (counted by reason), the enrolled one's are taken, and every agent is counted once."""
    site_broker = MosquittoBroker(workdir=tmp_path / "site-broker",
                                  settings=bridge_settings(mosquitto, FEDERATION)).start()
    fleet = make_fleet(tmp_path, site_broker, mosquitto, rounds=2, exit_when_finished=False)  # /metrics after
    bundle = tmp_path / "run" / "sites"
    site = site_process(fleet, site_broker, "s1", bundle)
    rogue = site_process(fleet, site_broker, "s1", bundle, name="rogue", client_id="site-rogue",
                         signing_key_file=tmp_path / "rogue" / "key.pem")
    try:
        fleet.start_coordinator()
        enroll_site(fleet, "s1", bundle)
        site.start()
        rogue.start()
        fleet.start_agents()
        rounds = wait_for_rounds(fleet, 2, 180)
        wait_until(lambda: len(partials_on(recorder)) >= 4, 60, "both aggregators' partials of both rounds")
        # On the wire is not yet judged: the root counts a refused partial on its loop, after its signature check.
        wait_until(lambda: refused_partials(scrape(fleet.http_port)) >= 2, 60, "the rogue's partials judged")
        samples = scrape(fleet.http_port)
    finally:
        fleet.stop()
        site.terminate()
        rogue.terminate()
        site_broker.stop()
    assert_all_completed(rounds, 2)
    assert_each_agent_once(rounds)
    assert all(r["answered"] == 2 and r["sites"]["s1"]["accepted"] == 2 for r in rounds), rounds
    assert refused_partials(samples) == 2, {k: v for k, v in samples.items() if k[0] == "fl_messages_rejected_total"}
    assert metric(samples, "fl_agents_answered_total") == 4


def test_a_bridge_cut_mid_round_and_restored_delivers_the_partial_once(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    """The site's uplink is cut once round 1 is announced: the site folds its agents' updates and publishes its
    partial into the cut; the site broker keeps it for the bridge (a persistent session), and it crosses once the
    link is back, within the root's deadline. Then the run goes on through the same bridge.

    The order is forced, not timed: the agents are paused once their statuses are at the site (the root still
    learns of them from the site's roster and opens round 1), and resume only after the cut."""
    uplink = TcpLink(mosquitto.host, mosquitto.port)
    site_broker = MosquittoBroker(workdir=tmp_path / "site-broker",
                                  settings=bridge_settings(mosquitto, FEDERATION, port=uplink.port)).start()
    fleet = make_fleet(tmp_path, site_broker, mosquitto, rounds=2)
    bundle = tmp_path / "run" / "sites"
    site = site_process(fleet, site_broker, "s1", bundle)
    topics = Topics(FEDERATION)
    at_site = WireRecorder(site_broker.url, f"fl/{FEDERATION}/#", client_id="site-wire").start()
    agents: list[ManagedProcess] = []
    try:
        fleet.start_coordinator()
        enroll_site(fleet, "s1", bundle)
        site.start()
        fleet.start_agents()
        wait_until(lambda: {topics.parse(m.topic).agent_id for m in at_site.snapshot(lambda m: bool(m.payload))
                            if topics.parse(m.topic).kind == "agent_status"} >= {"rpi-1", "rpi-2"}, 120,
                   "both agents' statuses at the site")
        agents = [p for p in fleet.processes() if p is not fleet.coordinator]
        for process in agents:
            os.kill(process.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        wait_until(lambda: bool(at_site.snapshot(lambda m: m.topic == topics.rounds_current and bool(m.payload))),
                   120, "round 1 announced at the site")
        uplink.cut()
        for process in agents:
            os.kill(process.pid, signal.SIGCONT)  # type: ignore[arg-type]
        agents = []
        wait_for_log(site, "round 1 cnn_small partial", 120)  # published into the cut
        assert not [p for p in partials_on(recorder) if p.round == 1], "the partial crossed a cut bridge"
        uplink.restore()
        rounds = wait_for_rounds(fleet, 2, 180)
    finally:
        for process in agents:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(process.pid, signal.SIGCONT)  # type: ignore[arg-type]
        at_site.stop()
        fleet.stop()
        site.terminate()
        site_broker.stop()
        uplink.close()
    assert_all_completed(rounds, 2)
    assert_each_agent_once(rounds)
    assert all(r["answered"] == 2 and r["sites"]["s1"]["accepted"] == 2 for r in rounds), rounds
    assert sorted(p.round for p in partials_on(recorder)) == [1, 2]
    assert uplink.connections >= 2  # the bridge came back through the restored link
