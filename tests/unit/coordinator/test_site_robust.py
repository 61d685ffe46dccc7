"""A robust rule inside each site, the agent-weighted mean across sites at the root: engines driven directly (no
broker), attackers at every site. What the root applies is checked against the rule computed here with numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.app.driver import EngineDriver
from coordinator.sites.engine import SiteEngine
from coordinator.sites.settings import SiteSettings
from protocol.messages import RoundAnnouncement, TrainMetrics, Update
from protocol.partials import PartialAggregate
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, weights
from tests.unit.coordinator.test_sites import PLAIN_MEAN, site_engine, tick_site

SITES = {"s1": ["a1", "a2", "a3", "a4", "a5"], "s2": ["b1", "b2", "b3", "b4", "b5", "b6", "b7"]}
ATTACKERS = {"a5", "b6", "b7"}
"""One of five at s1 (byzantine_f 1), two of seven at s2 (byzantine_f 2): enough for Krum's n > 2f + 2 at each."""
SAMPLES = {"a1": 10, "a2": 20, "a3": 7, "a4": 12, "a5": 5000,
           "b1": 30, "b2": 5, "b3": 8, "b4": 11, "b5": 3, "b6": 9000, "b7": 9000}
"""Attackers also claim huge sample counts: under a robust rule a counted agent weighs 1 whatever it claims."""


def delta_of(agent_id: str) -> dict[str, np.ndarray]:
    if agent_id in ATTACKERS:
        return {name: np.full(a.shape, 1e4, dtype=np.float32) for name, a in weights(0.0).items()}
    rng = np.random.default_rng(sum(map(ord, agent_id)))
    return {name: rng.standard_normal(a.shape).astype(np.float32) for name, a in weights(0.0).items()}


def answer(announcement: RoundAnnouncement, agent_id: str, run_id: str) -> Update:
    ref = announcement.states.get("f")
    body = {"weights": weights(1.0)} if ref is None else {"delta": delta_of(agent_id)}
    return Update(run_id=run_id, agent_id=agent_id, round=announcement.round, task="train", task_ref=DIGITS,
                  family="f", base_digest=ref.digest if ref else None, num_samples=SAMPLES[agent_id],
                  metrics=TrainMetrics(eval_loss=1.0, eval_accuracy=0.5, num_eval_samples=2), **body)


def run_round(root: EngineDriver, outbox, sites: dict[str, SiteEngine],  # type: ignore[no-untyped-def]
              answering: dict[str, list[str]]) -> list[PartialAggregate]:
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    partials = []
    for site_id, site in sites.items():
        site.on_message(TOPICS.rounds_current, payload)
        for agent_id in answering[site_id]:
            update = answer(announcement, agent_id, root.run.run_id)
            site.on_message(TOPICS.update(agent_id, announcement.round), encode_message(update))
        out = tick_site(site)[1]
        if not out:  # some of its agents did not answer: the site closes at its deadline
            site.clock.now += site.settings.site_deadline_fraction * site.settings.round_deadline_s  # type: ignore[attr-defined]
            out = tick_site(site)[1]
        for topic, sent in out:
            partials.append(decode_message(sent, PartialAggregate))
            root.on_message(topic, sent)
    root.tick()
    return partials


def setup(tmp_path: Path, rule: str, **site_settings: object):  # type: ignore[no-untyped-def]
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path, clock, **{**PLAIN_MEAN, "max_samples_per_update": 100_000})
    f = {"s1": 1, "s2": 2}
    sites = {s: site_engine(tmp_path, s, clock, aggregator=rule, byzantine_f=f[s], max_samples_per_update=100_000,
                            **site_settings) for s in SITES}
    for site_id, agents in SITES.items():
        for agent_id in agents:
            hello(sites[site_id], agent_id, samples=SAMPLES[agent_id])  # type: ignore[arg-type]
        for topic, payload in sites[site_id].tick()[1]:  # the roster, up the bridge
            root.on_message(topic, payload)
    return root, outbox, metrics, sites


@pytest.mark.parametrize("rule", ["median", "krum"])
def test_a_robust_rule_inside_each_site_keeps_every_sites_attackers_out(tmp_path: Path, rule: str) -> None:
    root, outbox, _, sites = setup(tmp_path, rule)
    run_round(root, outbox, sites, SITES)  # bootstrap: the seeded first state
    partials = run_round(root, outbox, sites, SITES)
    assert root.last_summary.outcome == "completed" and root.last_summary.answered == len(SAMPLES)
    assert {p.site_id: p.total_weight for p in partials} == {"s1": 5.0, "s2": 7.0}  # agents, not their claims
    first, got = weights(1.0), root.engine.parts.strategy.states["f"].weights  # the state round 2 made
    chosen = {}  # krum: per site, the update of least summed squared distance to its n - f - 2 nearest others
    for site_id, agents in SITES.items():
        f = 1 if site_id == "s1" else 2
        flat = np.stack([np.concatenate([a.astype(np.float64).ravel() for a in delta_of(agent).values()])
                         for agent in agents])
        scores = [np.sort(((flat - row) ** 2).sum(axis=1))[1:len(agents) - f - 1].sum() for row in flat]
        chosen[site_id] = agents[int(np.argmin(scores))]
    for name in first:
        per_site = {}
        for site_id, agents in SITES.items():
            stacked = np.stack([delta_of(a)[name].astype(np.float64) for a in agents])
            per_site[site_id] = np.median(stacked, axis=0) if rule == "median" else \
                delta_of(chosen[site_id])[name].astype(np.float64)
        mean = (5 * per_site["s1"] + 7 * per_site["s2"]) / 12
        np.testing.assert_allclose(got[name], (first[name] + mean).astype(np.float32), rtol=1e-6, atol=1e-6)
        assert np.abs(got[name] - first[name]).max() < 10, "an attacker's 1e4 reached the model"


def test_a_site_with_too_few_updates_for_its_rule_counts_none_of_them(tmp_path: Path) -> None:
    root, outbox, metrics, sites = setup(tmp_path, "median")
    run_round(root, outbox, sites, SITES)
    partials = run_round(root, outbox, sites, {"s1": ["a1", "a5"], "s2": SITES["s2"]})  # s1: n = 2, f = 1
    s1 = next(p for p in partials if p.site_id == "s1")
    assert s1.count == 0 and not s1.sums
    assert {a: (o.outcome, o.reason) for a, o in s1.outcomes.items()} == {
        "a1": ("rejected", "site_too_few"), "a5": ("rejected", "site_too_few"),
        **{a: ("straggler", None) for a in ("a2", "a3", "a4")}}
    summary = root.last_summary
    assert summary.outcome == "completed" and summary.sites["s1"]["rejected"] == 2
    assert metrics.registry.get_sample_value("fl_messages_rejected_total",
                                             {"kind": "update", "reason": "site_too_few"}) == 2


def test_a_site_refuses_secure_aggregation_and_async_rounds_at_start(tmp_path: Path) -> None:
    for fields in ({"secure_aggregation": True, "aggregator": "mean", "max_norm_ratio": 0},
                   {"mode": "async", "buffer_size": 3}):
        with pytest.raises(ValidationError, match="site aggregator"):
            SiteSettings(federation="t", site_id="s1", state_dir=tmp_path, **fields)  # type: ignore[arg-type]
