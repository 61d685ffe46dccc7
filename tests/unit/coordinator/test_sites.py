"""Site aggregators and the root, engines driven directly (no broker): what crosses a bridge is what the
root's outbox and the sites' outgoing lists hold, handed over by the test."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from coordinator.app.driver import EngineDriver
from coordinator.fleet.enrollment import enroll
from coordinator.sites.engine import SiteEngine
from coordinator.sites.settings import SiteSettings
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import AgentStatus, GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.partials import PartialAggregate
from protocol.security.signing import SigningKey
from protocol.site_rosters import SiteRoster
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, hello, make_engine, rejected, weights

PLAIN_MEAN = {"claim_cap_multiple": 0, "max_norm_ratio": 0, "rounds": 2}
"""The sample-weighted mean with no median-based bounds (those are each site's own; see docs)."""
SITES = {"s1": ["a1"], "s2": ["b1", "b2"], "s3": ["c1", "c2", "c3", "c4"]}
"""An uneven split: 1, 2 and 4 agents."""
SAMPLES = {"a1": 5, "b1": 40, "b2": 7, "c1": 13, "c2": 1, "c3": 22, "c4": 9}


def site_engine(tmp_path: Path, site_id: str, clock: Clock, signing_key: SigningKey | None = None,
                **overrides: object) -> SiteEngine:
    settings = SiteSettings(federation="t", site_id=site_id, state_dir=tmp_path / site_id, round_deadline_s=10.0,
                            min_available_agents=2, min_fit_agents=2, **{"enrollment": "open", **PLAIN_MEAN, **overrides})
    return SiteEngine(settings, CoordinatorMetrics(CollectorRegistry()), signing_key=signing_key,
                      coordinator_key=None, clock=clock, wall_clock=clock)


def vouch(root: EngineDriver, site_id: str, agents: list[str]) -> None:
    """The site's roster, up the bridge: its agents' statuses, which bind them to the site at the root (a partial
    names only agents bound to its site)."""
    statuses = [AgentStatus(agent_id=a, state="online", device="rpi", family="f", num_samples=SAMPLES[a],
                            num_eval_samples=2, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT)
                for a in agents]
    roster = SiteRoster(site_id=site_id, started_at=1.0, seq=1, statuses=statuses, present=list(agents))
    root.on_message(TOPICS.site_roster(site_id), encode_message(roster))


def tick_site(site: SiteEngine) -> tuple[float, list[tuple[str, bytes]]]:
    """The site's tick, without its rosters (the root already knows the agents: ``setup`` handed it the first)."""
    wait, out = site.tick()
    return wait, [(topic, payload) for topic, payload in out if not topic.endswith("/roster")]


def answer(announcement: RoundAnnouncement, agent_id: str, run_id: str, payload: dict[str, np.ndarray]) -> Update:
    ref = announcement.states.get("f")
    if announcement.task == "evaluate":
        fields: dict[str, object] = {}
    else:
        fields = {"weights": payload} if ref is None else {"delta": payload}
    return Update(run_id=run_id, agent_id=agent_id, round=announcement.round, task=announcement.task, task_ref=DIGITS,
                  family="f", base_digest=ref.digest if ref else None, num_samples=SAMPLES[agent_id],
                  metrics=TrainMetrics(eval_loss=1.0, eval_accuracy=0.5, num_eval_samples=2), **fields)


def payload_of(agent_id: str, round_number: int, task: str) -> dict[str, np.ndarray]:
    if round_number == 1:
        return weights(1.0)  # the seeded first state every agent proposes alike
    rng = np.random.default_rng([round_number, sum(map(ord, agent_id))])
    return {name: rng.standard_normal(a.shape).astype(np.float32) for name, a in weights(0.0).items()}


def plain_answer(announcement: RoundAnnouncement, agent_id: str, run_id: str) -> Update:
    return answer(announcement, agent_id, run_id, payload_of(agent_id, announcement.round, announcement.task))


def run_rounds(root: EngineDriver, outbox, sites: dict[str, SiteEngine] | None, rounds: int,  # type: ignore[no-untyped-def]
               make: Callable[[RoundAnnouncement, str, str], Update] = plain_answer) -> None:
    """``rounds`` rounds of every agent answering (``make`` builds each answer): through its site's aggregator, or
    (flat) to the root."""
    for _ in range(rounds):
        root.tick()
        payload = outbox.last(TOPICS.rounds_current)
        announcement = decode_message(payload, RoundAnnouncement)
        for site_id, agents in SITES.items():
            site = sites[site_id] if sites else None
            if site is not None:
                site.on_message(TOPICS.rounds_current, payload)  # down the bridge
            for agent_id in agents:
                message = make(announcement, agent_id, root.run.run_id)
                target = site if site is not None else root
                target.on_message(TOPICS.update(agent_id, announcement.round), encode_message(message))
            if site is not None:
                _, out = tick_site(site)  # every agent of the site answered: it closes at once
                assert out, f"site {site_id} published nothing"
                for topic, partial in out:  # up the bridge
                    root.on_message(topic, partial)
        root.tick()  # everyone accounted for: closes without waiting for the deadline
        assert root.last_summary is not None and root.last_summary.round == announcement.round
        assert root.last_summary.outcome == "completed", root.last_summary


def setup(tmp_path: Path, name: str, with_sites: bool, site_overrides: dict[str, object] | None = None,  # type: ignore[no-untyped-def]
          **overrides: object):
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path / name, clock, **{**PLAIN_MEAN, **overrides})
    sites = {s: site_engine(tmp_path / name, s, clock, **(site_overrides or {})) for s in SITES} if with_sites else None
    for site_id, agents in SITES.items():
        for agent_id in agents:  # flat: each status to the root; with sites, to the site, whose roster goes up
            hello(sites[site_id] if sites else root, agent_id, samples=SAMPLES[agent_id])  # type: ignore[arg-type]
        if sites:
            rosters = sites[site_id].tick()[1]
            assert [t for t, _ in rosters] == [TOPICS.site_roster(site_id)]
            for topic, payload in rosters:  # up the bridge: the root selects by it
                root.on_message(topic, payload)
    return root, outbox, metrics, sites


def test_the_mean_over_sites_equals_flat_fedavg_over_the_same_updates(tmp_path: Path) -> None:
    flat, flat_out, _, _ = setup(tmp_path, "flat", with_sites=False)
    root, root_out, metrics, sites = setup(tmp_path, "sites", with_sites=True)
    run_rounds(flat, flat_out, None, 3)  # a bootstrap round, a delta round, the final evaluation
    run_rounds(root, root_out, sites, 3)
    expected = decode_message(flat_out.last(TOPICS.global_state("f", 3)), GlobalState)
    got = decode_message(root_out.last(TOPICS.global_state("f", 3)), GlobalState)
    first = weights(1.0)
    for name, value in expected.weights.items():
        np.testing.assert_allclose(got.weights[name], value, rtol=1e-6, atol=1e-7)
        assert not np.allclose(value, first[name])  # the delta round moved the model
    # and the mean itself, in float64, to float64 rounding: sum_i n_i d_i / sum_i n_i
    total = sum(SAMPLES.values())
    for name in first:
        mean = sum(SAMPLES[a] * payload_of(a, 2, "train")[name].astype(np.float64) for a in SAMPLES) / total
        np.testing.assert_allclose(got.weights[name], (first[name] + mean).astype(np.float32), rtol=1e-6, atol=1e-7)
    summary = root.last_summary
    assert summary.task == "evaluate" and summary.answered == len(SAMPLES) and summary.stragglers == 0
    assert summary.sites == {s: {"accepted": len(a), "rejected": 0, "stragglers": 0, "bytes": summary.sites[s]["bytes"],
                                 "bytes_up": summary.sites[s]["bytes_up"]} for s, a in SITES.items()}
    assert all(0 < counts["bytes_up"] < counts["bytes"] for counts in summary.sites.values())
    assert metrics.registry.get_sample_value("fl_rounds_total", {"outcome": "completed"}) == 3


def test_a_sites_rejects_and_stragglers_reach_the_root_and_nothing_counts_twice(tmp_path: Path) -> None:
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path, clock, **PLAIN_MEAN)
    site = site_engine(tmp_path, "s3", clock)
    vouch(root, "s3", SITES["s3"])
    for agent_id in SITES["s3"]:
        hello(site, agent_id, samples=SAMPLES[agent_id])  # type: ignore[arg-type]
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site.on_message(TOPICS.rounds_current, payload)
    good = answer(announcement, "c1", root.run.run_id, weights(1.0))
    site.on_message(TOPICS.update("c1", 1), encode_message(good))
    site.on_message(TOPICS.update("c2", 1), encode_message(good.model_copy(update={"agent_id": "c2", "run_id": "x"})))
    site.on_message(TOPICS.update("c3", 1), encode_message(answer(announcement, "c3", root.run.run_id, weights(1.0))))
    _, out = tick_site(site)
    assert out == []  # c4 has not answered and the site's deadline is not there yet
    clock.now += 0.8 * 10.0  # the site's deadline: 0.8 of the round's
    _, out = tick_site(site)
    (topic, sent), = out
    partial = decode_message(sent, PartialAggregate)
    assert {a: o.outcome for a, o in partial.outcomes.items()} == {
        "c1": "accepted", "c2": "rejected", "c3": "accepted", "c4": "straggler"}
    assert partial.outcomes["c2"].reason == "wrong_run" and partial.count == 2
    root.on_message(topic, sent)
    root.on_message(topic, sent)  # a resent copy: refused whole
    assert rejected(metrics, "duplicate", kind="partial") == 1
    root.tick()  # every selected agent is accounted for: the round closes before the root's deadline
    summary = root.last_summary
    assert summary.outcome == "completed" and summary.answered == 2
    assert summary.stragglers == 1 and summary.rejected == 1  # c4; c2, rejected at the site for its run id
    assert summary.sites["s3"] == {"accepted": 2, "rejected": 1, "stragglers": 1, "bytes": summary.sites["s3"]["bytes"],
                                   "bytes_up": len(sent)}
    assert rejected(metrics, "wrong_run") == 1


def test_the_root_takes_partials_only_from_enrolled_site_keys(tmp_path: Path) -> None:
    clock = Clock()
    state = tmp_path / "state"
    agent_keys = {a: SigningKey.generate() for a in ("c1", "c2")}
    site_key, stranger = SigningKey.generate(), SigningKey.generate()
    for agent_id, key in agent_keys.items():
        enroll(state / "enrolled.json", agent_id, key.public_key, None)
    enroll(state / "enrolled.json", "s3", site_key.public_key, None)
    root, outbox, metrics = make_engine(tmp_path, clock, enrollment="required", **PLAIN_MEAN)
    site = site_engine(tmp_path, "s3", clock, signing_key=stranger, enrollment="required",
                       enrolled_agents_file=state / "enrolled.json")
    statuses = []
    for agent_id, key in agent_keys.items():
        status = AgentStatus(agent_id=agent_id, state="online", device="rpi", family="f", num_samples=SAMPLES[agent_id],
                             num_eval_samples=2, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT)
        site.on_message(TOPICS.agent_status(agent_id), encode_message(key.seal(encode_message(status))))
        statuses.append(status)
    roster = SiteRoster(site_id="s3", started_at=1.0, seq=1, statuses=statuses, present=list(agent_keys))
    root.on_message(TOPICS.site_roster("s3"), encode_message(site_key.seal(encode_message(roster))))  # the real key
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site.on_message(TOPICS.rounds_current, payload)
    for agent_id, key in agent_keys.items():
        message = answer(announcement, agent_id, root.run.run_id, weights(1.0))
        site.on_message(TOPICS.update(agent_id, 1), encode_message(key.seal(encode_message(message))))
    _, out = tick_site(site)
    (topic, forged), = out
    root.on_message(topic, forged)  # signed by a key the root never enrolled for s3
    assert rejected(metrics, "unknown_signer", kind="partial") == 1 and root.open.updates == {}
    site.signing_key = site_key
    site.round, site.next_round = None, 1
    site.on_message(TOPICS.rounds_current, payload)
    for agent_id, key in agent_keys.items():
        message = answer(announcement, agent_id, root.run.run_id, weights(1.0))
        site.on_message(TOPICS.update(agent_id, 1), encode_message(key.seal(encode_message(message))))
    _, out = tick_site(site)
    root.on_message(*out[0])
    assert set(root.open.updates) == {"c1", "c2"}


@pytest.mark.parametrize("field, value, reason", [("run_id", "other", "wrong_run"), ("round", 7, "topic_mismatch")])
def test_a_partial_of_another_run_or_round_is_refused(tmp_path: Path, field: str, value: object, reason: str) -> None:
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path, clock, **PLAIN_MEAN)
    hello(root, "a"), hello(root, "b")
    root.tick()
    partial = PartialAggregate(run_id=root.run.run_id, site_id="s1", round=1, family="f", base_digest=None,
                               total_weight=0.0, count=0, outcomes={})
    root.on_message(TOPICS.partial("s1", 1), encode_message(partial.model_copy(update={field: value})))
    assert rejected(metrics, reason, kind="partial") == 1


def test_a_restarted_site_holds_updates_that_come_before_their_announcement_and_statuses(tmp_path: Path) -> None:
    """What its persistent session queued while it was down may reach a restarted site aggregator before the retained
    announcement and statuses: held, then judged once those come; one partial, every agent counted once."""
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path, clock, **PLAIN_MEAN)
    vouch(root, "s2", SITES["s2"])
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site = site_engine(tmp_path, "s2", clock)  # just (re)started: knows no run, round or agent yet
    site.connected()
    for agent_id in SITES["s2"]:  # the session's queue first
        message = answer(announcement, agent_id, root.run.run_id, weights(1.0))
        site.on_message(TOPICS.update(agent_id, 1), encode_message(message))
    site.on_message(TOPICS.rounds_current, payload)
    hello(site, "b1", samples=SAMPLES["b1"])  # type: ignore[arg-type]
    assert tick_site(site)[1] == [] and len(site.held) == 1  # b1 judged; b2 waits for its status
    hello(site, "b2", samples=SAMPLES["b2"])  # type: ignore[arg-type]
    assert tick_site(site)[1] == []  # every known agent answered, but statuses may still be landing
    clock.now += 1.0
    _, out = tick_site(site)
    (topic, sent), = out
    partial = decode_message(sent, PartialAggregate)
    assert {a: o.outcome for a, o in partial.outcomes.items()} == {"b1": "accepted", "b2": "accepted"}
    root.on_message(topic, sent)
    root.tick()
    assert root.last_summary.outcome == "completed" and root.last_summary.answered == 2
    assert not site.metrics.registry.get_sample_value("fl_updates_total", {"outcome": "rejected"})


def test_a_site_judges_what_it_held_when_the_round_closes(tmp_path: Path) -> None:
    """An update whose agent never says hello is held no longer than its round: refused (late) at the close."""
    clock = Clock()
    root, outbox, _ = make_engine(tmp_path, clock, **PLAIN_MEAN)
    for agent_id in SITES["s2"]:
        hello(root, agent_id, samples=SAMPLES[agent_id])
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site = site_engine(tmp_path, "s2", clock)
    site.on_message(TOPICS.rounds_current, payload)
    hello(site, "b1", samples=SAMPLES["b1"])  # type: ignore[arg-type]
    message = answer(announcement, "b2", root.run.run_id, weights(1.0))
    site.on_message(TOPICS.update("b2", 1), encode_message(message))
    assert len(site.held) == 1
    clock.now += 0.8 * 10.0
    (_, sent), = tick_site(site)[1]
    assert set(decode_message(sent, PartialAggregate).outcomes) == {"b1"} and len(site.held) == 0
    assert site.metrics.registry.get_sample_value("fl_updates_total", {"outcome": "rejected"}) == 1


def test_a_site_clips_against_its_whole_cohort_s_median_whatever_order_its_agents_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3's agents send deltas of 0.1 (c1, c2) and 0.5 (c3, c4) a value; the site clips to its median norm. Held
    for the whole cohort, the bound is 0.1's norm in either order; holding only the first three, the large ones
    first set a bound of 0.5's and nothing was clipped."""
    def make(announcement: RoundAnnouncement, agent_id: str, run_id: str) -> Update:
        if announcement.round == 1:
            return plain_answer(announcement, agent_id, run_id)
        size = 0.5 if agent_id in ("c3", "c4") else 0.1
        return answer(announcement, agent_id, run_id, {k: np.full_like(v, size) for k, v in weights(0).items()})

    states = []
    for name, order in (("forward", ["c1", "c2", "c3", "c4"]), ("backward", ["c4", "c3", "c2", "c1"])):
        monkeypatch.setitem(SITES, "s3", order)
        root, outbox, _, sites = setup(tmp_path, name, with_sites=True, site_overrides={"max_norm_ratio": 1.0})
        run_rounds(root, outbox, sites, 3, make)  # the bootstrap round, the delta round, the evaluation
        states.append(decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState).weights["w"])
    np.testing.assert_array_equal(states[0], states[1])
    total = sum(SAMPLES.values())  # every delta 0.1 a value: at s3 clipped to it, at s1 and s2 sent so
    np.testing.assert_allclose(states[0], 1.0 + 0.1 * total / total, rtol=1e-6)


def _restarted_site_mean(tmp_path: Path, order: list[str], small: float = 0.1) -> np.ndarray:
    root, outbox, _, sites = setup(tmp_path, "x", with_sites=True, site_overrides={"max_norm_ratio": 1.0})
    run_rounds(root, outbox, sites, 1)  # the bootstrap
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site = site_engine(tmp_path / "restarted", "s3", Clock(), max_norm_ratio=1.0)  # s3's aggregator restarted
    site.on_message(TOPICS.rounds_current, payload)  # the retained announcement first ...
    for agent in order:
        hello(site, agent, samples=SAMPLES[agent])  # ... then the retained statuses
    for agent in order:
        size = 0.5 if agent in ("c3", "c4") else small
        delta = {k: np.full_like(v, size) for k, v in weights(0).items()}
        site.on_message(TOPICS.update(agent, announcement.round),
                        encode_message(answer(announcement, agent, root.run.run_id, delta)))
    (_, sealed), = tick_site(site)[1]
    partial = decode_message(sealed, PartialAggregate)
    return partial.sums["w"] / partial.total_weight


def test_a_restarted_site_s_clip_does_not_depend_on_arrival_order(tmp_path: Path) -> None:
    """A site that restarts hears the retained announcement before its agents' retained statuses: it knew no cohort
    and held only HOLD deltas. Selected agents it does not know now count in every family's cohort."""
    forward = _restarted_site_mean(tmp_path / "f", ["c1", "c2", "c3", "c4"])
    backward = _restarted_site_mean(tmp_path / "b", ["c4", "c3", "c2", "c1"])
    np.testing.assert_allclose(forward, backward, rtol=1e-9)


def test_a_site_whose_median_delta_is_zero_bounds_the_others_to_nothing(tmp_path: Path) -> None:
    """c1 and c2 send zero deltas, c3 and c4 0.5 a value: the low median of the four norms is 0, so the site's bound is
    0 and the large deltas are folded with a clip factor of 0; its partial is a mean of zeros, not a failed fold."""
    np.testing.assert_array_equal(_restarted_site_mean(tmp_path, ["c1", "c2", "c3", "c4"], small=0.0), 0.0)


ORDER_DIRECT = {"d1": 0.1, "d2": 5.0, "d3": 5.0}


def _model_with_partials_after(tmp_path: Path, name: str, partials_after: int) -> np.ndarray:
    root, outbox, _, sites = setup(tmp_path, name, with_sites=True, max_norm_ratio=1.0)
    for d in ORDER_DIRECT:
        hello(root, d, samples=SAMPLES[d])
    for round_number in (1, 2):
        root.tick()
        payload = outbox.last(TOPICS.rounds_current)
        announcement = decode_message(payload, RoundAnnouncement)
        assert announcement.round == round_number and set(ORDER_DIRECT) <= set(announcement.selected)
        partials = []
        for site_id, agents in SITES.items():
            site = sites[site_id]
            site.on_message(TOPICS.rounds_current, payload)
            for agent in agents:
                site.on_message(TOPICS.update(agent, round_number),
                                encode_message(plain_answer(announcement, agent, root.run.run_id)))
            partials += tick_site(site)[1]
        direct = []
        for d, size in ORDER_DIRECT.items():
            arrays = weights(1.0) if round_number == 1 else {k: np.full_like(v, size) for k, v in weights(0).items()}
            direct.append((TOPICS.update(d, round_number), encode_message(answer(announcement, d, root.run.run_id,
                                                                                 arrays))))
        cut = partials_after if round_number == 2 else len(direct)
        for topic, message in direct[:cut] + partials + direct[cut:]:
            root.on_message(topic, message)
        root.tick()
        assert root.last_summary.round == round_number and root.last_summary.outcome == "completed"
    root.tick()
    return decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState).weights["w"]


def test_the_root_s_bound_on_a_site_s_mean_does_not_depend_on_arrival_order(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A site's mean is bounded by the root's median of direct deltas: taken when the partial arrived, that rested
    on whichever direct deltas came first. While the gate holds the family's deltas the sums wait for the close."""
    for d in ORDER_DIRECT:
        monkeypatch.setitem(SAMPLES, d, 10)
    partials_early = _model_with_partials_after(tmp_path, "early", partials_after=1)
    partials_late = _model_with_partials_after(tmp_path, "late", partials_after=3)
    np.testing.assert_allclose(partials_early, partials_late, rtol=1e-6)
