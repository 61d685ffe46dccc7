"""A root restarted mid-round forgets the sites' partials it had taken (the open round's updates are not in its
checkpoint). A site that had sent its partial ignored the re-announced round and refused its agents' resent updates
as late: its work was lost (the round missed its quorum; found in review). The site now sends the partials of the
round it closed again when a new root session (its signed status) has that round open, as agents resend their
updates; a re-delivered announcement or status of the same session (a bridge that reconnects) sends nothing."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.app.driver import EngineDriver
from coordinator.sites.engine import SiteEngine
from coordinator.sites.settings import SiteSettings
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import RoundAnnouncement, Update
from protocol.security.signing import SigningKey
from protocol.wire import decode_message, encode_message
from tests.unit.coordinator.test_engine import TOPICS, Clock, Outbox, hello, make_engine, rejected, weights
from tests.unit.coordinator.test_sites import PLAIN_MEAN, SAMPLES, SITES, answer, site_engine, tick_site, vouch


@dataclass
class ClosedAtSite:
    """Round 1 of a root and site s2: the site took both its agents' updates and closed; its partials not sent yet."""

    root: EngineDriver
    outbox: Outbox
    metrics: CoordinatorMetrics
    site: SiteEngine
    announcement: bytes
    status: bytes
    updates: dict[str, Update]
    partials: list[tuple[str, bytes]]


def closed_at_site(tmp_path: Path, clock: Clock) -> ClosedAtSite:
    root, outbox, metrics = make_engine(tmp_path, clock, **PLAIN_MEAN)
    site = site_engine(tmp_path, "s2", clock)
    vouch(root, "s2", SITES["s2"])
    for agent_id in SITES["s2"]:
        hello(site, agent_id, samples=SAMPLES[agent_id])  # type: ignore[arg-type]
    root.tick()
    payload, status = outbox.last(TOPICS.rounds_current), outbox.last(TOPICS.coordinator_status)
    announcement = decode_message(payload, RoundAnnouncement)
    site.on_message(TOPICS.coordinator_status, status)
    site.on_message(TOPICS.rounds_current, payload)
    updates = {a: answer(announcement, a, root.run.run_id, weights(1.0)) for a in SITES["s2"]}
    for agent_id, message in updates.items():
        site.on_message(TOPICS.update(agent_id, 1), encode_message(message))
    _, out = tick_site(site)  # both answered: the site closes and its partial goes up
    assert out
    return ClosedAtSite(root, outbox, metrics, site, payload, status, updates, out)


def test_a_sites_accepted_partial_survives_a_root_restart(tmp_path: Path) -> None:
    clock = Clock()
    at = closed_at_site(tmp_path, clock)
    for topic, partial in at.partials:
        at.root.on_message(topic, partial)  # accepted by the root (acked: the broker will not deliver it again)
    assert set(at.root.open.updates) == set(SITES["s2"])

    # SIGKILL before the root's tick closes round 1; a new process resumes the run from the state directory.
    again, again_out, _ = make_engine(tmp_path, clock, **PLAIN_MEAN)
    vouch(again, "s2", SITES["s2"])  # the site's roster comes again (resync)
    assert again.open is not None and again.open.number == 1
    # The new session's status and re-announcement cross the bridge; the site's agents resend their updates too.
    resent = at.site.on_message(TOPICS.coordinator_status, again_out.last(TOPICS.coordinator_status))
    resent += at.site.on_message(TOPICS.rounds_current, again_out.last(TOPICS.rounds_current))
    assert len(resent) == 1  # once, whichever of the two comes first
    for topic, partial in resent:
        again.on_message(topic, partial)
    for agent_id, message in at.updates.items():
        at.site.on_message(TOPICS.update(agent_id, 1), encode_message(message))
    clock.now += 10.0
    for topic, partial in tick_site(at.site)[1]:
        again.on_message(topic, partial)
    again.tick()
    summary = again.last_summary
    assert summary is not None and summary.round == 1
    assert (summary.outcome, summary.answered) == ("completed", 2), summary


def test_a_bridge_that_reconnects_sends_the_partials_once(tmp_path: Path) -> None:
    at = closed_at_site(tmp_path, Clock())
    for topic, partial in at.partials:
        at.root.on_message(topic, partial)
    # The retained status and announcement again, as a bridge that reconnects delivers them: same session, nothing sent.
    assert at.site.on_message(TOPICS.coordinator_status, at.status) == []
    assert at.site.on_message(TOPICS.rounds_current, at.announcement) == []
    assert rejected(at.metrics, "duplicate", "partial") == 0
    assert set(at.root.open.updates) == set(SITES["s2"])


ROOT_KEY = SigningKey.generate()


def signed(payload: bytes) -> bytes:
    """What the root publishes when it has a signing key (the test root has none: sealed here, as it would be)."""
    return encode_message(ROOT_KEY.seal(payload))


def keyed_site(tmp_path: Path, clock: Clock) -> SiteEngine:
    settings = SiteSettings(federation="t", site_id="s2", state_dir=tmp_path / "s2", round_deadline_s=10.0,
                            min_available_agents=2, min_fit_agents=2, **{"enrollment": "open", **PLAIN_MEAN})
    return SiteEngine(settings, CoordinatorMetrics(CollectorRegistry()), signing_key=None,
                      coordinator_key=ROOT_KEY.public_key, clock=clock, wall_clock=clock)


def test_replayed_older_root_statuses_do_not_make_a_site_resend_again(tmp_path: Path) -> None:
    """A signed status verifies whatever its age: replaying the root's earlier sessions' statuses alternately made the
    site send its partials up the bridge every time (found in review). Once per session now."""
    clock = Clock()
    root, outbox, _ = make_engine(tmp_path, clock, **PLAIN_MEAN)
    site = keyed_site(tmp_path, clock)
    vouch(root, "s2", SITES["s2"])
    for agent_id in SITES["s2"]:
        hello(site, agent_id, samples=SAMPLES[agent_id])  # type: ignore[arg-type]
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    status_s0 = signed(outbox.last(TOPICS.coordinator_status))
    site.on_message(TOPICS.coordinator_status, status_s0)
    site.on_message(TOPICS.rounds_current, signed(payload))
    for agent_id in SITES["s2"]:
        site.on_message(TOPICS.update(agent_id, 1), encode_message(answer(announcement, agent_id, root.run.run_id,
                                                                          weights(1.0))))
    _, out = tick_site(site)
    assert out
    # The root restarts (session S1): the site resends once, as designed.
    again, again_out, metrics = make_engine(tmp_path, clock, **PLAIN_MEAN)
    vouch(again, "s2", SITES["s2"])
    status_s1 = signed(again_out.last(TOPICS.coordinator_status))
    resent = site.on_message(TOPICS.coordinator_status, status_s1)
    assert len(resent) == 1
    for topic, partial in resent:
        again.on_message(topic, partial)
    # Anyone replays the two genuine signed statuses (S0's was retained once; both are recorded).
    sends = 0
    for _ in range(5):
        for old in (status_s0, status_s1):
            for topic, partial in site.on_message(TOPICS.coordinator_status, old):
                sends += 1
                again.on_message(topic, partial)
    assert sends == 0, f"replayed old statuses made the site resend its partials {sends} times " \
                       f"({rejected(metrics, 'duplicate', 'partial')} refused as duplicate at the root)"
