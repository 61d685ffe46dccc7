"""SCAFFOLD behind site aggregators: a site folds its agents' control deltas beside their deltas and sends the sums
up (``control_sums``); the root's new weights and server variate equal flat SCAFFOLD's over the same updates. A site
checks each control delta against the layout the round announced; the root refuses a partial whose control sums
are missing or misshapen (before, one such partial failed every SCAFFOLD round) and bounds a site's mean control
delta as it bounds one agent's."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator.aggregation.running_mean import l2_norm
from coordinator.app.driver import EngineDriver
from coordinator.sites.engine import SiteEngine
from protocol.messages import GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator import test_site_plain_attacks as attacks
from tests.unit.coordinator import test_site_secure as secure
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, hello, make_engine, rejected, weights
from tests.unit.coordinator.test_secure_fedproto import FAMILIES, FEDPROTO
from tests.unit.coordinator.test_secure_fedproto import SAMPLES as PROTO_SAMPLES
from tests.unit.coordinator.test_secure_rounds import SECURE
from tests.unit.coordinator.test_sites import SAMPLES, SITES, payload_of, run_rounds, setup, site_engine, tick_site

SCAFFOLD = {"algorithm": "scaffold"}


def control_of(agent_id: str, round_number: int) -> dict[str, np.ndarray]:
    if round_number == 1:
        return {name: np.zeros_like(a) for name, a in weights(0.0).items()}  # nothing trained in a bootstrap
    rng = np.random.default_rng([round_number, 7, sum(map(ord, agent_id))])
    return {name: rng.standard_normal(a.shape).astype(np.float32) for name, a in weights(0.0).items()}


def scaffold_answer(announcement: RoundAnnouncement, agent_id: str, run_id: str,
                    control: dict[str, np.ndarray] | None = None) -> Update:
    ref = announcement.states.get("f")
    payload = payload_of(agent_id, announcement.round, announcement.task)
    fields: dict[str, object] = {}
    if announcement.task == "train":
        fields = {"weights" if ref is None else "delta": payload,
                  "control_delta": control if control is not None else control_of(agent_id, announcement.round)}
    return Update(run_id=run_id, agent_id=agent_id, round=announcement.round, task=announcement.task, task_ref=DIGITS,
                  family="f", base_digest=ref.digest if ref else None, num_samples=SAMPLES[agent_id],
                  metrics=TrainMetrics(eval_loss=1.0, eval_accuracy=0.5, num_eval_samples=2), **fields)


def run_scaffold_rounds(root: EngineDriver, outbox, sites: dict[str, SiteEngine] | None,  # type: ignore[no-untyped-def]
                        rounds: int) -> None:
    run_rounds(root, outbox, sites, rounds, make=scaffold_answer)


def test_scaffold_over_sites_equals_flat_scaffold_over_the_same_updates(tmp_path: Path) -> None:
    flat, flat_out, _, _ = setup(tmp_path, "flat", with_sites=False, rounds=3, **SCAFFOLD)
    root, root_out, metrics, sites = setup(tmp_path, "sites", with_sites=True, rounds=3, **SCAFFOLD)
    run_scaffold_rounds(flat, flat_out, None, 3)  # a bootstrap round, then two delta rounds
    run_scaffold_rounds(root, root_out, sites, 3)
    assert root.last_summary.sites is not None and set(root.last_summary.sites) == set(SITES)
    after_2 = (decode_message(out.last(TOPICS.global_state("f", 3)), GlobalState) for out in (flat_out, root_out))
    after_3 = (driver.strategy.states["f"] for driver in (flat, root))
    for expected, got in (after_2, after_3):
        for name in expected.weights:
            np.testing.assert_allclose(got.weights[name], expected.weights[name], rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(got.control[name], expected.control[name], rtol=1e-6, atol=1e-7)
    # c after round 2, in float64: every agent answered, so |S|/N = 1 and c is the sample-weighted mean control delta
    total = sum(SAMPLES.values())
    c2 = decode_message(root_out.last(TOPICS.global_state("f", 3)), GlobalState).control
    for name in c2:
        mean = sum(SAMPLES[a] * control_of(a, 2)[name].astype(np.float64) for a in SAMPLES) / total
        np.testing.assert_allclose(c2[name], mean.astype(np.float32), rtol=1e-6, atol=1e-7)
        assert np.abs(c2[name]).max() > 0.01
    assert metrics.registry.get_sample_value("fl_rounds_total", {"outcome": "completed"}) == 3


def test_a_scaffold_round_announces_the_control_layout_and_a_site_checks_it(tmp_path: Path) -> None:
    root, outbox, metrics, sites = setup(tmp_path, "sites", with_sites=True, rounds=3, **SCAFFOLD)
    run_scaffold_rounds(root, outbox, sites, 1)
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    assert set(announcement.control_layouts) == {"f"}
    site = sites["s3"]
    site.on_message(TOPICS.rounds_current, payload)
    run_id = root.run.run_id
    wrong = {"w": np.zeros((3, 2), np.float32), "b": np.zeros(3, np.float32)}
    cases = {"c1": wrong, "c2": {"w": np.zeros((2, 3), np.float32)}, "c3": {}}
    for agent_id, control in cases.items():
        site.on_message(TOPICS.update(agent_id, 2), encode_message(scaffold_answer(announcement, agent_id, run_id, control)))
    site.on_message(TOPICS.update("c4", 2), encode_message(scaffold_answer(announcement, "c4", run_id)))
    _, out = tick_site(site)
    (partial,) = [decode_message(p, PartialAggregate) for _, p in out]
    assert {a: (o.outcome, o.reason) for a, o in partial.outcomes.items()} == {
        "c1": ("rejected", "bad_shape"), "c2": ("rejected", "bad_shape"), "c3": ("rejected", "missing_payload"),
        "c4": ("accepted", None)}
    assert set(partial.control_sums) == {"w", "b"}
    np.testing.assert_allclose(partial.control_sums["w"], SAMPLES["c4"] * control_of("c4", 2)["w"].astype(np.float64))


def test_a_fedavg_partial_carries_no_control_fields_on_the_wire(tmp_path: Path) -> None:
    root, outbox, _, sites = setup(tmp_path, "sites", with_sites=True, rounds=3)
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    assert b"control_layouts" not in payload
    site = sites["s1"]
    site.on_message(TOPICS.rounds_current, payload)
    announcement = decode_message(payload, RoundAnnouncement)
    update = Update(run_id=root.run.run_id, agent_id="a1", round=1, task="train", task_ref=DIGITS, family="f",
                    base_digest=None, num_samples=5, weights=weights(1.0),
                    metrics=TrainMetrics(eval_loss=1.0, eval_accuracy=0.5, num_eval_samples=2))
    assert announcement.round == 1
    site.on_message(TOPICS.update("a1", 1), encode_message(update))
    _, out = tick_site(site)
    assert out and all(b"control_sums" not in p and b"proposal_control" not in p for _, p in out)


# -- a site that lies, or runs an older build: the root's checks ------------------------------------------------
def scaffold_root(tmp_path: Path, direct: tuple[str, ...] = tuple(attacks.DIRECT)):  # type: ignore[no-untyped-def]
    """test_site_plain_attacks' federation under SCAFFOLD (default bounds): the ``direct`` agents and sites s1 and s2
    of one agent each, which propose the first state with them; returns with round 2 (a delta round) open, the
    direct agents' deltas (0.1) and control deltas (0.2) in."""
    clock = Clock()
    root, _, metrics = make_engine(tmp_path, clock, rounds=3, quorum_fraction=0.5, **SCAFFOLD)
    lay = attacks.layout(attacks.model(0.0))
    for agent_id in direct:
        root.on_message(TOPICS.agent_status(agent_id), encode_message(attacks.status(agent_id, lay)))
    for site, agents in attacks.SITE_AGENTS.items():
        roster = attacks.SiteRoster(site_id=site, started_at=1.0, seq=1, present=list(agents),
                                    statuses=[attacks.status(a, lay) for a in agents])
        root.on_message(TOPICS.site_roster(site), encode_message(roster))
    root.tick()
    zero = {k: np.zeros_like(v) for k, v in attacks.model(0.0).items()}
    for agent_id in direct:
        msg = attacks.update(root, agent_id, 10, weights=attacks.model(1.0), control_delta=zero)
        root.on_message(TOPICS.update(agent_id, 1), encode_message(msg))
    for site, agents in attacks.SITE_AGENTS.items():
        accepted = {a: AgentOutcome(outcome="accepted", samples=10, weight=10.0) for a in agents}
        attacks.send_partial(root, attacks.partial(root, site, accepted, proposal=attacks.model(1.0),
                                                   proposal_control=zero))
    root.tick()
    assert root.last_summary.round == 1 and root.last_summary.outcome == "completed", root.last_summary
    root.tick()
    assert root.open.number == 2
    for agent_id in direct:
        msg = attacks.update(root, agent_id, 10, delta=attacks.model(0.1), control_delta=attacks.model(0.2))
        root.on_message(TOPICS.update(agent_id, 2), encode_message(msg))
    return root, metrics, clock


def site_sums(value: float, samples: int = 10) -> dict[str, np.ndarray]:
    return {k: samples * v.astype("<f8") for k, v in attacks.model(value).items()}


def test_a_partial_without_control_sums_is_refused_and_the_scaffold_round_completes(tmp_path: Path) -> None:
    root, metrics, clock = scaffold_root(tmp_path)
    accepted = {"s1x": AgentOutcome(outcome="accepted", samples=10, weight=10.0)}
    attacks.send_partial(root, attacks.partial(root, "s1", accepted, sums=site_sums(0.1), heaviest="s1x"))
    assert rejected(metrics, "bad_partial", "partial") == 1
    attacks.send_partial(root, attacks.partial(root, "s2", {"s2x": AgentOutcome(outcome="straggler")}))
    attacks.close_after_the_deadline(root, clock)
    np.testing.assert_allclose(root.strategy.states["f"].control["w"], 0.2 * 3 / 5, rtol=1e-6)  # 3 of N = 5 answered


def test_a_sites_mean_control_delta_is_bounded_like_one_agents(tmp_path: Path) -> None:
    root, metrics, clock = scaffold_root(tmp_path)
    accepted = {"s1x": AgentOutcome(outcome="accepted", samples=10, weight=10.0)}
    attacks.send_partial(root, attacks.partial(root, "s1", accepted, sums=site_sums(0.1), heaviest="s1x",
                                               control_sums=site_sums(1e6)))
    attacks.send_partial(root, attacks.partial(root, "s2", {"s2x": AgentOutcome(outcome="straggler")}))
    root.tick()
    assert root.last_summary.round == 2 and root.last_summary.outcome == "completed", root.last_summary
    assert "s1" in root.last_summary.clipped_norms
    # every control delta is then at most the direct agents' median norm (max_norm_ratio 1): c moves by 0.2 a value
    np.testing.assert_allclose(root.strategy.states["f"].control["w"], 0.2 * 4 / 5, rtol=1e-5)


def test_a_bootstrap_proposal_without_a_control_delta_is_refused(tmp_path: Path) -> None:
    clock = attacks.Clock()
    root, outbox, metrics = attacks.make_engine(tmp_path, clock, rounds=3, quorum_fraction=0.5, **SCAFFOLD)
    lay = attacks.layout(attacks.model(0.0))
    for agent_id in attacks.DIRECT:
        root.on_message(TOPICS.agent_status(agent_id), encode_message(attacks.status(agent_id, lay)))
    roster = attacks.SiteRoster(site_id="s1", started_at=1.0, seq=1, present=["s1x"],
                                statuses=[attacks.status("s1x", lay)])
    root.on_message(TOPICS.site_roster("s1"), encode_message(roster))
    root.tick()
    accepted = {"s1x": AgentOutcome(outcome="accepted", samples=10, weight=10.0)}
    attacks.send_partial(root, attacks.partial(root, "s1", accepted, proposal=attacks.model(1.0), count=1,
                                               total_weight=10.0))
    assert rejected(metrics, "bad_partial", "partial") == 1
    assert "s1x" not in root.open.updates


# -- secure rounds: a site's SecAgg+ session masks the control delta beside the delta ----------------------------
def test_a_secure_scaffold_round_behind_sites_moves_x_and_c_as_the_plain_round_would(tmp_path: Path) -> None:
    fed = secure.Federation(tmp_path, **{**secure.SECURE, **SCAFFOLD})
    ann = fed.announce()  # round 1 bootstraps in the clear: seeded weights and a zero control delta
    zero = {name: np.zeros_like(a) for name, a in weights(0.0).items()}
    for site_id, agents in secure.SITES.items():
        for agent_id in agents:
            update = Update(run_id=ann.run_id, agent_id=agent_id, round=1, task="train", task_ref=DIGITS, family="f",
                            base_digest=None, num_samples=secure.SAMPLES[agent_id], metrics=TrainMetrics(),
                            weights=weights(1.0), control_delta=zero)
            fed.sites[site_id].on_message(TOPICS.update(agent_id, 1), encode_message(update))
    fed.pump()
    fed.root.tick()
    ann = fed.announce()
    assert ann.round == 2 and ann.secure is not None and ann.secure.control_clip is not None
    assert set(ann.secure.sites) == set(secure.SITES)
    for participant in fed.agents.values():
        participant.begin(ann)
    fed.pump()
    control = {a: {n: np.clip(v, -0.5, 0.5) for n, v in control_of(a, 2).items()} for a in secure.SAMPLES}
    for agent_id in secure.SAMPLES:
        update = Update(run_id=ann.run_id, agent_id=agent_id, round=2, task="train", task_ref=DIGITS, family="f",
                        base_digest=ann.states["f"].digest, num_samples=secure.SAMPLES[agent_id],
                        metrics=TrainMetrics(eval_accuracy=0.5, eval_loss=1.0, num_eval_samples=2),
                        delta=secure.delta_of(agent_id), control_delta=control[agent_id])
        assert fed.agents[agent_id].takes(update)
    fed.pump()
    summary = fed.root.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (2, "completed", 7), summary
    fed.root.tick()
    moved = fed.state(3)
    cap = {s: ann.secure.sites[s].families["f"].weight_cap for s in secure.SITES}
    site_of = {a: s for s, agents in secure.SITES.items() for a in agents}
    w = {a: min(secure.SAMPLES[a], cap[site_of[a]]) for a in secure.SAMPLES}
    step = max(secure.quantiser(ann.secure, held.families["f"]).step for held in ann.secure.sites.values())
    for name in ("w", "b"):
        expected = sum(w[a] * control[a][name].astype(np.float64) for a in w) / sum(w.values())
        assert np.abs(moved.control[name] - expected).max() <= 4 * len(w) * step + 1e-6
        assert np.abs(expected).max() > 0.05


def test_a_site_refuses_a_fedproto_update_without_prototypes(tmp_path: Path) -> None:
    """A delta where FedProto's round wants prototypes (the site folds FedProto now: test_site_fedproto.py)."""
    root, outbox, _, sites = setup(tmp_path, "sites", with_sites=True, rounds=3)
    root.tick()
    announcement = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    fedproto = announcement.model_copy(update={"algorithm": "fedproto"})
    site = sites["s1"]
    site.on_message(TOPICS.rounds_current, encode_message(fedproto))
    site.on_message(TOPICS.update("a1", 1), encode_message(scaffold_answer(fedproto, "a1", root.run.run_id)))
    _, out = tick_site(site)
    (partial,) = [decode_message(p, PartialAggregate) for _, p in out]
    assert partial.outcomes["a1"].outcome == "rejected" and partial.outcomes["a1"].reason == "missing_payload"


def test_fedproto_agents_behind_a_site_get_one_session_there_across_their_families(tmp_path: Path) -> None:
    """FedProto's session spans every family: the site's agents get one of the site's own, under both their families'
    names (relayed there by the site), apart from the root's session of the agents it holds itself."""
    clock = Clock()
    root, outbox, _ = make_engine(tmp_path, clock, **{**SECURE, **FEDPROTO, "min_available_agents": 8,
                                                      "min_fit_agents": 8})
    behind = {"s1x": "cnn_large", "s1y": "mlp_tiny", "s1z": "mlp_tiny"}
    for agent, family in FAMILIES.items():
        hello(root, agent, family=family, samples=PROTO_SAMPLES[agent])
    statuses = [attacks.status(a, LAYOUT).model_copy(update={"family": f}) for a, f in behind.items()]
    roster = attacks.SiteRoster(site_id="s1", started_at=1.0, seq=1, present=list(behind), statuses=statuses)
    root.on_message(TOPICS.site_roster("s1"), encode_message(roster))
    assert root.engine.parts.rosters.site_of == {a: "s1" for a in behind}
    root.tick()
    ann = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert ann.secure is not None and set(behind) <= set(ann.selected)
    held = ann.secure.sites["s1"].families
    assert sorted(held) == ["cnn_large", "mlp_tiny"] and held["cnn_large"] == held["mlp_tiny"]
    assert sorted(held["cnn_large"].roster) == sorted(behind)
    assert not set(behind) & set(ann.secure.families["cnn_large"].roster)


# -- found in review: stray control deltas, a robust site's control, memory, a root with no bound of its own -----
def round_two(tmp_path: Path, **site_settings: object):  # type: ignore[no-untyped-def]
    """test_sites' federation (FedAvg unless ``algorithm`` says otherwise) after its bootstrap round, round 2 open
    and announced to site s3 (rebuilt with ``site_settings``)."""
    algorithm = site_settings.pop("algorithm", "fedavg")
    root, outbox, _, sites = setup(tmp_path, "sites", with_sites=True, rounds=3, algorithm=algorithm)
    run_scaffold_rounds(root, outbox, sites, 1)
    site = site_engine(tmp_path / "rebuilt", "s3", Clock(), **site_settings) if site_settings else sites["s3"]
    for agent_id in SITES["s3"]:
        hello(site, agent_id, samples=SAMPLES[agent_id])
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    site.on_message(TOPICS.rounds_current, payload)
    return root, site, decode_message(payload, RoundAnnouncement)


def test_a_stray_control_delta_in_a_fedavg_round_is_ignored_and_voids_nothing(tmp_path: Path) -> None:
    root, site, ann = round_two(tmp_path, max_norm_ratio=1.0)  # the norm gate holds the first updates
    odd = {"c1": {"w": np.ones((2, 2), np.float32)}, "c2": {"x": np.ones(3, np.float32)}}
    for agent_id in SITES["s3"]:
        message = scaffold_answer(ann, agent_id, root.run.run_id, odd.get(agent_id))
        if agent_id not in odd:
            message = message.model_copy(update={"control_delta": {}})
        site.on_message(TOPICS.update(agent_id, 2), encode_message(message))  # two layouts: nothing raises
    _, out = tick_site(site)
    (partial,) = [decode_message(p, PartialAggregate) for _, p in out]
    assert not partial.control_sums and {o.outcome for o in partial.outcomes.values()} == {"accepted"}
    for topic, payload in out:
        root.on_message(topic, payload)
    assert set(SITES["s3"]) <= set(root.open.updates)


def test_a_robust_site_combines_control_deltas_unclipped_as_the_root_does(tmp_path: Path) -> None:
    root, site, ann = round_two(tmp_path, algorithm="scaffold", aggregator="median", clip_norm=1.0)
    for agent_id in SITES["s3"]:
        site.on_message(TOPICS.update(agent_id, 2), encode_message(scaffold_answer(ann, agent_id, root.run.run_id)))
    _, out = tick_site(site)
    (partial,) = [decode_message(p, PartialAggregate) for _, p in out]
    controls = [control_of(a, 2) for a in SITES["s3"]]
    assert all(l2_norm(c) > 1.5 for c in controls)  # clip_norm 1 would have shortened each
    for name in controls[0]:
        median = np.median(np.stack([c[name].astype(np.float64) for c in controls]), axis=0)
        np.testing.assert_allclose(partial.control_sums[name], 4 * median, rtol=1e-5)


def test_a_site_lets_each_control_delta_go_once_folded(tmp_path: Path) -> None:
    root, site, ann = round_two(tmp_path, algorithm="scaffold")
    for agent_id in SITES["s3"][:2]:
        site.on_message(TOPICS.update(agent_id, 2), encode_message(scaffold_answer(ann, agent_id, root.run.run_id)))
    assert site.round is not None and len(site.round.open.updates) == 2
    assert all(not (u.delta or u.weights or u.control_delta) for u in site.round.open.updates.values())


def one_agent(site: str) -> dict[str, AgentOutcome]:
    return {attacks.SITE_AGENTS[site][0]: AgentOutcome(outcome="accepted", samples=10, weight=10.0)}


def test_with_no_bound_of_its_own_the_root_bounds_each_site_by_the_sites_median(tmp_path: Path) -> None:
    root, _, _ = scaffold_root(tmp_path, direct=())
    attacks.send_partial(root, attacks.partial(root, "s1", one_agent("s1"), heaviest="s1x", sums=site_sums(50.0),
                                               control_sums=site_sums(1e6)))
    attacks.send_partial(root, attacks.partial(root, "s2", one_agent("s2"), heaviest="s2x", sums=site_sums(0.1),
                                               control_sums=site_sums(0.2)))
    root.tick()
    assert root.last_summary.round == 2 and root.last_summary.outcome == "completed", root.last_summary
    assert root.last_summary.clipped_norms == ["s1"]
    state = root.strategy.states["f"]
    np.testing.assert_allclose(state.control["w"], 0.2, rtol=1e-5)  # of two, the smaller sets the bound
    np.testing.assert_allclose(state.weights["w"], 1.1, rtol=1e-5)


def test_a_sites_finite_sums_whose_mean_overflows_the_state_are_refused(tmp_path: Path) -> None:
    root, metrics, clock = scaffold_root(tmp_path, direct=())
    huge = {name: np.full(a.shape, 1e300) for name, a in site_sums(0.0).items()}  # finite in float64, not in float32
    attacks.send_partial(root, attacks.partial(root, "s1", one_agent("s1"), heaviest="s1x", sums=huge,
                                               control_sums=site_sums(0.2)))
    assert rejected(metrics, "bad_partial", "partial") == 1
    attacks.send_partial(root, attacks.partial(root, "s2", one_agent("s2"), heaviest="s2x", sums=site_sums(0.1),
                                               control_sums=site_sums(0.2)))
    attacks.close_after_the_deadline(root, clock)
    np.testing.assert_allclose(root.strategy.states["f"].weights["w"], 1.1, rtol=1e-5)
