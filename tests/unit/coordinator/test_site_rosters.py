"""Site rosters: agents' statuses reach the root through their site's signed roster, not one by one. Engines driven
directly (no broker): what crosses a bridge is what the site's tick and the root's outbox hold, handed over here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.app.driver import EngineDriver
from coordinator.fleet.enrollment import enroll
from coordinator.sites.engine import SiteEngine
from coordinator.sites.roster import BATCH_S
from coordinator.sites.settings import SiteSettings
from protocol.messages import AgentStatus, RoundAnnouncement
from protocol.security.signing import SigningKey
from protocol.site_rosters import SiteResync, SiteRoster
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, make_engine, rejected
from tests.unit.coordinator.test_sites import site_engine


def status(agent_id: str, seq: int, samples: int = 10, epoch: int = 1, **fields: object) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state="online", device="rpi", family="f", num_samples=samples,
                       num_eval_samples=2, version="t", timestamp=float(seq), task_ref=DIGITS, layout=LAYOUT,
                       epoch=epoch, seq=seq, label_counts=np.array([samples - 1, 1] + [0] * 8, dtype=np.int64), **fields)


def rosters_of(site: SiteEngine) -> list[tuple[str, bytes]]:
    return [(t, p) for t, p in site.tick()[1] if t.endswith("/roster")]


def up(root: EngineDriver, sent: list[tuple[str, bytes]]) -> list[SiteRoster]:
    """Hand the site's rosters to the root, as its bridge would; return them decoded."""
    for topic, payload in sent:
        root.on_message(topic, payload)
    return [decode_message(p, SiteRoster) for _, p in sent]


def test_statuses_reach_the_root_in_the_sites_roster_and_heartbeats_that_change_nothing_do_not(tmp_path: Path) -> None:
    clock = Clock()
    root, outbox, _ = make_engine(tmp_path, clock)
    site = site_engine(tmp_path, "s1", clock)
    for agent_id in ("a1", "a2", "a3"):
        site.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, 1)))
    (first,) = up(root, rosters_of(site))
    assert [s.agent_id for s in first.statuses] == ["a1", "a2", "a3"] and first.present == ["a1", "a2", "a3"]
    assert first.statuses[0].label_counts is not None  # the root weighs and watches by them
    registry = root.engine.parts.registry
    assert sorted(registry.agent_ids()) == ["a1", "a2", "a3"] and registry.get("a1").status.seq == 1
    assert "a1" in root.engine.parts.labels
    root.tick()
    assert decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).selected == ["a1", "a2", "a3"]

    # Heartbeats (a new timestamp and seq only) are not news; a changed sample count is, once the batch window passed.
    clock.now += 1.0
    for agent_id in ("a1", "a2"):
        site.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, 2)))
    site.on_message(TOPICS.agent_status("a3"), encode_message(status("a3", 2, samples=30)))
    (news,) = up(root, rosters_of(site))
    assert [s.agent_id for s in news.statuses] == ["a3"] and news.present is None and news.seq == 2
    assert registry.get("a3").status.num_samples == 30
    assert rosters_of(site) == []  # nothing new, and the present list is not due
    # Every roster_interval_s, the ids heard from since the last list keep those agents live at the root.
    clock.now += site.settings.roster_interval_s
    last_seen = registry.get("a1").last_seen
    (keepalive,) = up(root, rosters_of(site))
    assert keepalive.statuses == [] and keepalive.present == ["a1", "a2", "a3"]
    assert registry.get("a1").last_seen > last_seen
    clock.now += site.settings.roster_interval_s  # nobody spoke since: an empty list
    assert up(root, rosters_of(site))[0].present == []


def test_a_decommissioned_agent_is_forgotten_at_the_root_through_the_roster(tmp_path: Path) -> None:
    clock = Clock()
    root, _, _ = make_engine(tmp_path, clock)
    site = site_engine(tmp_path, "s1", clock)
    for agent_id in ("a1", "a2"):
        site.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, 1)))
    up(root, rosters_of(site))
    site.on_message(TOPICS.agent_status("a2"), b"")  # the operator cleared its retained status
    clock.now += BATCH_S
    (roster,) = up(root, rosters_of(site))
    assert roster.gone == ["a2"] and root.engine.parts.registry.agent_ids() == ["a1"]


def test_an_agent_a_site_stops_hearing_times_out_at_the_root(tmp_path: Path) -> None:
    clock = Clock()
    root, _, _ = make_engine(tmp_path, clock, agent_timeout_s=30.0)
    site = site_engine(tmp_path, "s1", clock, agent_timeout_s=30.0, roster_interval_s=10.0)
    for agent_id in ("a1", "a2"):
        site.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, 1)))
    up(root, rosters_of(site))
    registry = root.engine.parts.registry
    for seq in range(2, 5):  # a1 keeps its heartbeat, a2 falls silent
        clock.now += 10.0
        site.on_message(TOPICS.agent_status("a1"), encode_message(status("a1", seq)))
        up(root, rosters_of(site))
    clock.now += 0.5  # past a2's timeout counted from when the site last heard it, as if a2 spoke to the root
    assert registry.is_online("a1", clock.now) and not registry.is_online("a2", clock.now)


def test_a_restarted_root_asks_the_site_for_the_statuses_it_lost(tmp_path: Path) -> None:
    clock = Clock()
    site = site_engine(tmp_path, "s1", clock)
    first_root, _, _ = make_engine(tmp_path / "first", clock)
    for agent_id in ("a1", "a2"):
        site.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, 1)))
    up(first_root, rosters_of(site))
    root, outbox, _ = make_engine(tmp_path / "second", clock)  # knows none of the site's agents
    clock.now += site.settings.roster_interval_s
    for agent_id in ("a1", "a2"):  # heartbeats: nothing new, so only their ids go up
        site.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, 2)))
    (keepalive,) = up(root, rosters_of(site))
    assert keepalive.statuses == [] and keepalive.present == ["a1", "a2"]
    request = decode_message(outbox.last(TOPICS.site_resync("s1")), SiteResync)
    assert request.site_id == "s1" and request.agents is None  # it knows none of them: all
    site.on_message(TOPICS.site_resync("s1"), outbox.last(TOPICS.site_resync("s1")))  # down the bridge
    clock.now += BATCH_S
    (resent,) = up(root, rosters_of(site))
    assert [s.agent_id for s in resent.statuses] == ["a1", "a2"]
    assert sorted(root.engine.parts.registry.agent_ids()) == ["a1", "a2"]


def test_a_replayed_roster_changes_nothing_and_a_roster_cannot_bring_back_an_older_status(tmp_path: Path) -> None:
    clock = Clock()
    root, _, metrics = make_engine(tmp_path, clock)
    site = site_engine(tmp_path, "s1", clock)
    site.on_message(TOPICS.agent_status("a1"), encode_message(status("a1", 1)))
    (old,) = rosters_of(site)
    up(root, [old])
    clock.now += 1.0
    site.on_message(TOPICS.agent_status("a1"), encode_message(status("a1", 2, samples=50)))
    up(root, rosters_of(site))
    registry = root.engine.parts.registry
    assert registry.get("a1").status.num_samples == 50
    up(root, [old])  # replayed: an older roster of this site
    assert rejected(metrics, "stale_roster", kind="site_roster") == 1 and registry.get("a1").status.num_samples == 50
    # A newer roster that carries an older status of the agent (a lying site) cannot set it back either.
    lying = SiteRoster(site_id="s1", started_at=site.book.started_at, seq=99, statuses=[status("a1", 1, samples=5)])
    root.on_message(TOPICS.site_roster("s1"), encode_message(lying))
    assert rejected(metrics, "stale_status", kind="agent_status") == 1 and registry.get("a1").status.num_samples == 50


def test_the_root_takes_rosters_only_from_the_sites_enrolled_key_and_only_for_enrolled_agents(tmp_path: Path) -> None:
    clock = Clock()
    state = tmp_path / "state"
    site_key, stranger, agent_key = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    enroll(state / "enrolled.json", "s1", site_key.public_key, None)
    enroll(state / "enrolled.json", "a1", agent_key.public_key, None)
    root, _, metrics = make_engine(tmp_path, clock, enrollment="required")
    roster = SiteRoster(site_id="s1", started_at=1.0, seq=1, statuses=[status("a1", 1), status("ghost", 1)],
                        present=["a1", "ghost"])
    root.on_message(TOPICS.site_roster("s1"), encode_message(stranger.seal(encode_message(roster))))
    assert rejected(metrics, "unknown_signer", kind="site_roster") == 1
    root.on_message(TOPICS.site_roster("s2"), encode_message(site_key.seal(encode_message(roster))))  # s1's on s2's
    assert root.engine.parts.registry.agent_ids() == []
    root.on_message(TOPICS.site_roster("s1"), encode_message(site_key.seal(encode_message(roster))))
    assert root.engine.parts.registry.agent_ids() == ["a1"]  # ghost is enrolled nowhere here
    assert rejected(metrics, "unknown_agent", kind="agent_status") == 1


def test_a_site_forwards_only_statuses_it_admitted(tmp_path: Path) -> None:
    """A status signed by another agent's key never reaches a roster (the site checks as the root would)."""
    clock = Clock()
    state = tmp_path / "state"
    keys = {a: SigningKey.generate() for a in ("a1", "a2")}
    for agent_id, key in keys.items():
        enroll(state / "enrolled.json", agent_id, key.public_key, None)
    site = site_engine(tmp_path, "s1", clock, enrollment="required", enrolled_agents_file=state / "enrolled.json")
    site.on_message(TOPICS.agent_status("a1"), encode_message(keys["a1"].seal(encode_message(status("a1", 1)))))
    site.on_message(TOPICS.agent_status("a2"), encode_message(keys["a1"].seal(encode_message(status("a2", 1)))))
    ((_, payload),) = rosters_of(site)
    roster = decode_message(payload, SiteRoster)
    assert [s.agent_id for s in roster.statuses] == ["a1"] and roster.present == ["a1"]


def test_many_changes_take_several_rosters_in_a_row(tmp_path: Path) -> None:
    clock = Clock()
    site = site_engine(tmp_path, "s1", clock, max_known_agents=3000)
    for i in range(2500):
        site.on_message(TOPICS.agent_status(f"a{i:04d}"), encode_message(status(f"a{i:04d}", 1)))
    rosters = [decode_message(p, SiteRoster) for _, p in rosters_of(site)]
    assert [len(r.statuses) for r in rosters] == [1000, 1000, 500] and [r.seq for r in rosters] == [1, 2, 3]
    assert [r.present is not None for r in rosters] == [False, False, True] and len(rosters[-1].present or []) == 2500


@pytest.mark.parametrize("fields", [
    {"statuses": [status("a1", 1), status("a1", 2)]},
    {"present": ["a1", "a1"]},
    {"present": ["a1"], "gone": ["a1"]},
    {"seq": 0},
])
def test_a_malformed_roster_is_refused_by_its_schema(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SiteRoster(**{"site_id": "s1", "started_at": 1.0, "seq": 1, **fields})  # type: ignore[arg-type]


def test_a_roster_interval_too_long_for_the_timeout_fails_at_start_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="roster_interval_s"):
        SiteSettings(federation="t", site_id="s1", state_dir=tmp_path, agent_timeout_s=30.0, roster_interval_s=20.0)
