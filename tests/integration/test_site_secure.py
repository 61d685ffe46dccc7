"""Secure aggregation inside a site, with real processes and brokers: a root coordinator with secure_aggregation on,
a site broker bridged to the root's, the site aggregator and three agents at the site. The round after the
bootstrap gives the site the agents' session; their stages and masked inputs stay on the site broker (the root
broker, watched, sees none), the site's relays are signed with its enrolled key, and what crosses the bridge is one
secure partial with the unmasked ring sum, which the root folds into a completed round."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import GlobalState, RoundAnnouncement
from protocol.partials import PartialAggregate
from protocol.topics import Topics
from tests.integration.sites import bridge_settings, enroll_site, site_process
from tests.integration.wire import Seen, WireRecorder, assert_all_completed, decode_wire, wait_for_rounds

pytestmark = pytest.mark.integration

FEDERATION = "securesites"
ROUNDS = 2


SECURE = {"rounds": ROUNDS, "min_available_agents": 3, "min_fit_agents": 3, "local_epochs": 1, "round_deadline_s": 120,
          "secure_aggregation": True, "secagg_stage_s": 30.0, "max_norm_ratio": 0, "claim_cap_multiple": 0}


def run_at_a_site(tmp_path: Path, root: MosquittoBroker, agents: list[AgentSpec],
                  **settings: object) -> tuple[list[dict], list[Seen]]:
    """A root coordinator (``SECURE`` and ``settings``), one site s1 behind a bridged broker holding ``agents``, run
    to the end: the rounds it logged, and what was seen on the site's broker."""
    site_broker = MosquittoBroker(workdir=tmp_path / "site-broker", settings=bridge_settings(root, FEDERATION)).start()
    fleet = Fleet(tmp_path / "run", site_broker.url, FleetSpec(agents=agents, alpha=1.0),
                  {"broker_url": root.url, **SECURE, **settings}, federation=FEDERATION)
    site_dir = tmp_path / "run" / "sites"
    site = site_process(fleet, site_broker, "s1", site_dir)
    at_site = WireRecorder(site_broker.url, f"fl/{FEDERATION}/#", client_id="site-wire").start()
    try:
        fleet.start_coordinator()
        enroll_site(fleet, "s1", site_dir)
        site.start()
        fleet.start_agents()
        return wait_for_rounds(fleet, ROUNDS + 1, 300), at_site.snapshot()
    finally:
        at_site.stop()
        fleet.stop()
        site.terminate()
        site_broker.stop()


def test_a_site_serves_its_agents_secure_session_and_only_the_unmasked_sum_crosses_the_bridge(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    rounds, _ = run_at_a_site(tmp_path, mosquitto, [AgentSpec(f"rpi-{i}", "rpi", i) for i in range(3)])
    assert_all_completed(rounds, ROUNDS + 1)
    trained = [r for r in rounds if r["task"] == "train"]
    assert [r["answered"] for r in trained] == [3, 3], trained
    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]
    assert not [m.topic for parsed, m in seen if parsed.kind in ("update", "secagg", "secagg_relay", "secagg_inbox")], \
        "an agent's update, stage or relay crossed the bridge"
    announcements = [decode_wire(m.payload, RoundAnnouncement) for parsed, m in seen if parsed.kind == "round" and m.payload]
    secure = [a for a in announcements if a.secure is not None]
    assert secure and all(list(a.secure.sites) == ["s1"] and not a.secure.families for a in secure), secure
    held = secure[0].secure.sites["s1"]
    assert held.key is not None and sorted(held.families["cnn_small"].roster) == ["rpi-0", "rpi-1", "rpi-2"]
    partials = [decode_wire(m.payload, PartialAggregate) for parsed, m in seen if parsed.kind == "partial"]
    by_round = {p.round: p for p in partials}
    assert not by_round[1].secure and by_round[1].proposal  # the bootstrap: seeded weights, in the clear
    assert by_round[2].secure and by_round[2].count == 3 and not by_round[2].sums, by_round[2]
    assert all(o.outcome == "accepted" and o.weight == 0 for o in by_round[2].outcomes.values())


def test_secure_fedproto_at_a_site_masks_two_families_in_one_session_behind_the_bridge(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    """FedProto, secure from round 1: the site's Raspberry Pis and phone (two model families) share one session,
    relayed on both families' topics at the site; one secure partial per round crosses the bridge, naming agents of
    both families, and the root publishes prototypes learned from all of them."""
    agents = [AgentSpec("rpi-0", "rpi", 0), AgentSpec("rpi-1", "rpi", 1), AgentSpec("phone-2", "phone", 2)]
    rounds, at_site = run_at_a_site(tmp_path, mosquitto, agents, algorithm="fedproto")
    assert_all_completed(rounds, ROUNDS + 1)
    trained = [r for r in rounds if r["task"] == "train"]
    assert [r["answered"] for r in trained] == [3, 3], trained
    assert all(r["secure"]["sites"] == {"s1/cnn_small": {"roster": 3, "summed": True}} for r in trained), trained
    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]
    assert not [m.topic for parsed, m in seen if parsed.kind in ("update", "secagg", "secagg_relay", "secagg_inbox")], \
        "an agent's update, stage or relay crossed the bridge"
    relayed = {parsed.family for parsed, m in ((topics.parse(m.topic), m) for m in at_site)
               if parsed.kind == "secagg_relay" and m.payload}
    assert relayed == {"cnn_small", "mlp_tiny"}  # the one session's keys and unmasking, on both families' topics
    partials = [decode_wire(m.payload, PartialAggregate) for parsed, m in seen if parsed.kind == "partial"]
    # One per training round (the session's), then the evaluation round's, one per family, in the clear.
    assert sorted((p.round, p.family) for p in partials) == [
        (1, "cnn_small"), (2, "cnn_small"), (3, "cnn_small"), (3, "mlp_tiny")]
    for partial in (p for p in partials if p.round <= ROUNDS):
        assert partial.secure and partial.family == "cnn_small" and partial.count == 3, partial
        assert set(partial.outcomes) == {"rpi-0", "rpi-1", "phone-2"} and partial.prototype_sums is None
    states = [decode_wire(m.payload, GlobalState) for parsed, m in seen if parsed.kind == "global_state" and m.payload]
    last = max((s for s in states if s.family == "mlp_tiny"), key=lambda s: s.round)
    assert last.round == ROUNDS + 1 and last.prototypes is not None and last.prototype_counts is not None
    assert int(last.prototype_counts.sum()) > 0
