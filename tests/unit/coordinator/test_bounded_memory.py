"""What a remote sender can grow is bounded: every per-agent structure by the registry's cap (an evicted or
forgotten agent is let go everywhere), a site's roster by what the registry holds, pinned families by what a
round can announce, and an agent's state-change log lines by a per-agent interval."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from coordinator.app.driver import EngineDriver
from protocol.agent_status import PrivacySpent
from protocol.messages import AgentStatus
from protocol.site_rosters import SiteRoster
from protocol.wire import encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, make_engine
from tests.unit.coordinator.test_sites import site_engine

N = 1_000
CAP = 10


def st(agent_id: str, seq: int = 1, state: str = "online", family: str = "f", **fields: object) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state=state, device="rpi", family=family, num_samples=10,
                       num_eval_samples=2, version="t", timestamp=float(seq), task_ref=DIGITS, layout=LAYOUT,
                       epoch=1, seq=seq, **fields)


def flood_new_ids(engine: EngineDriver, clock: Clock, **fields: object) -> None:
    """Open enrollment: statuses under fresh ids, in batches spaced past agent_timeout_s (90s default),
    so the bounded registry evicts the silent ones and takes the next batch."""
    for i in range(N):
        if i % CAP == 0:
            clock.now += 100.0
        engine.on_message(TOPICS.agent_status(f"x{i}"), encode_message(st(f"x{i}", **fields)))


def test_what_is_kept_per_agent_beside_the_registry_is_bounded_by_it(tmp_path: Path) -> None:
    """Fresh ids past the registry's cap: the evicted ones are let go from the direct set and the privacy view."""
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, max_known_agents=CAP)
    flood_new_ids(engine, clock, privacy=PrivacySpent(epsilon=1.0, delta=1e-5))
    parts = engine.engine.parts
    assert len(parts.registry) <= CAP
    assert len(parts.rosters.direct) <= 2 * CAP, f"RosterOrder.direct holds {len(parts.rosters.direct)} ids"
    assert len(parts.privacy._agents) <= 2 * CAP, f"FleetPrivacy holds {len(parts.privacy._agents)} agents"


def test_a_rosters_present_list_binds_only_agents_the_registry_holds(tmp_path: Path) -> None:
    """Open enrollment: anyone may post as a site. present names ids the registry never took."""
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, max_known_agents=CAP)
    for seq in range(1, 11):
        roster = SiteRoster(site_id=f"s{seq}", started_at=1.0, seq=1,
                            present=[f"p{seq}_{i}" for i in range(10_000)])
        engine.on_message(TOPICS.site_roster(f"s{seq}"), encode_message(roster))
    parts = engine.engine.parts
    assert len(parts.registry) <= CAP
    assert len(parts.rosters.site_of) <= 2 * CAP, f"RosterOrder.site_of holds {len(parts.rosters.site_of)} ids"


def test_pinned_families_are_bounded_by_what_a_round_can_announce(tmp_path: Path) -> None:
    """One agent under a new family name per round opening: a 1-of-1 majority pins each."""
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, min_available_agents=1, min_fit_agents=1, rounds=10_000)
    parts = engine.engine.parts
    for i in range(200):
        engine.on_message(TOPICS.agent_status("evil"), encode_message(st("evil", seq=i + 1, family=f"fam{i}")))
        engine.engine.run.open = None  # stand for the next opening
        engine.tick()
    assert len(parts.task.layouts) <= 64, f"{len(parts.task.layouts)} families pinned (checkpointed, logged)"


def test_a_flapping_agent_cannot_flood_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock)
    caplog.set_level(logging.INFO)
    caplog.clear()
    for seq in range(1, 2001):
        state = "online" if seq % 2 else "offline"
        engine.on_message(TOPICS.agent_status("flap"), encode_message(st("flap", seq=seq, state=state)))
    lines = [r for r in caplog.records if "flap" in r.getMessage()]
    assert len(lines) <= 50, f"{len(lines)} log lines from one agent's 2000 statuses"


def test_site_roster_book_is_bounded_by_the_site_registry(tmp_path: Path) -> None:
    clock = Clock()
    site = site_engine(tmp_path, "s1", clock, max_known_agents=CAP)
    for i in range(N):
        if i % CAP == 0:
            clock.now += 100.0
        site.on_message(TOPICS.agent_status(f"x{i}"), encode_message(st(f"x{i}")))
    assert len(site.registry) <= CAP
    assert len(site.book.latest) <= 2 * CAP, f"RosterBook.latest holds {len(site.book.latest)} statuses"


def test_metrics_label_sets_stay_bounded_whatever_devices_report(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    for i in range(500):
        s = st(f"d{i}", privacy=PrivacySpent(epsilon=1.0, delta=1e-5), reconnects=3,
               session=f"s{i}", denied=1)
        s = s.model_copy(update={"device": f"dev{i}"})
        engine.on_message(TOPICS.agent_status(f"d{i}"), encode_message(s))
        s2 = s.model_copy(update={"session": f"t{i}", "seq": 2})
        engine.on_message(TOPICS.agent_status(f"d{i}"), encode_message(s2))
    clock.now += 5
    engine.tick()
    series = sum(len(m.samples) for m in metrics.registry.collect())
    assert series < 1500, series
