"""FedProto behind site aggregators: a site sends per-class sums of count x prototype and the counts, the root adds
them to its own agents' and divides once, so the global prototypes equal flat FedProto's over the same agents. A
lying site (counts past its agents' samples, another shape, sums beside a FedAvg round) is refused whole. In
secure rounds each site runs one SecAgg+ session across its agents' families and sends up only its unmasked sum. Engines driven directly, as in test_sites.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.aggregation.aggregator import build_aggregator
from coordinator.settings import CoordinatorSettings
from coordinator.sites.engine import SiteEngine
from coordinator.strategies.fedproto import aggregate_prototypes
from protocol.messages import GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.secagg.vector import quantiser
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, rejected
from tests.unit.coordinator.test_secure_fedproto import FAMILIES, SAMPLES, local_prototypes
from tests.unit.coordinator.test_sites import plain_answer, run_rounds, setup, site_engine, tick_site

SITES = {"s1": ["a"], "s2": ["b", "d"], "s3": ["c", "e", "g"]}
"""Uneven, and across both families; ``h`` answers the root directly."""
DIRECT = ["h"]
PROTO = {"algorithm": "fedproto", "proto_momentum": 0.0, "claim_cap_multiple": 0, "max_norm_ratio": 0, "rounds": 2,
         "min_available_agents": 7, "min_fit_agents": 7}


def answer(announcement: RoundAnnouncement, agent: str, run_id: str,
           sent: dict[str, tuple[np.ndarray, np.ndarray]]) -> Update:
    family = FAMILIES[agent]
    ref = announcement.states.get(family)
    fields: dict[str, object] = {}
    if announcement.task == "train":
        fields = {"prototypes": sent[agent][0], "prototype_counts": sent[agent][1]}
    return Update(run_id=run_id, agent_id=agent, round=announcement.round, task=announcement.task, task_ref=DIGITS,
                  family=family, base_digest=ref.digest if ref else None, num_samples=SAMPLES[agent],
                  metrics=TrainMetrics(eval_loss=1.0, eval_accuracy=0.5, num_eval_samples=2), **fields)


def federation(tmp_path: Path, with_sites: bool, **overrides: object):  # type: ignore[no-untyped-def]
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path / "root", clock, **{**PROTO, **overrides})
    at_site = {k: v for k, v in {**PROTO, **overrides}.items()  # a site's own: how it folds, not the root's plan
               if k in ("algorithm", "proto_momentum", "claim_cap_multiple", "max_norm_ratio", "rounds", "aggregator",
                        "byzantine_f")}
    sites = {s: site_engine(tmp_path, s, clock, **at_site) for s in SITES} if with_sites else {}
    for site_id, agents in SITES.items():
        for agent in agents:
            hello(sites.get(site_id) or root, agent, family=FAMILIES[agent], samples=SAMPLES[agent])  # type: ignore[arg-type]
        if with_sites:
            for topic, payload in sites[site_id].tick()[1]:  # its roster, up the bridge
                root.on_message(topic, payload)
    for agent in DIRECT:
        hello(root, agent, family=FAMILIES[agent], samples=SAMPLES[agent])
    return root, outbox, metrics, sites, clock


def run_round(root, outbox, sites: dict[str, SiteEngine], sent: dict[str, tuple[np.ndarray, np.ndarray]],  # type: ignore[no-untyped-def]
              edit=lambda partial: partial) -> RoundAnnouncement:
    """One round: every agent answers (through its site, if any); ``edit`` may change a partial on its way up."""
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    for site_id, agents in SITES.items():
        site = sites.get(site_id)
        if site is not None:
            site.on_message(TOPICS.rounds_current, payload)
        for agent in agents:
            message = encode_message(answer(announcement, agent, root.run.run_id, sent))
            (site or root).on_message(TOPICS.update(agent, announcement.round), message)
        if site is not None:
            for topic, sealed in tick_site(site)[1]:
                root.on_message(topic, encode_message(edit(decode_message(sealed, PartialAggregate))))
    for agent in DIRECT:
        root.on_message(TOPICS.update(agent, announcement.round),
                        encode_message(answer(announcement, agent, root.run.run_id, sent)))
    root.tick()
    return announcement


def site_round_one(root, outbox, sites: dict[str, SiteEngine], site_id: str,  # type: ignore[no-untyped-def]
                   sent: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[RoundAnnouncement, list[PartialAggregate]]:
    """Round 1 announced, and ``site_id``'s agents answering it there: the announcement and the site's partials."""
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site = sites[site_id]
    site.on_message(TOPICS.rounds_current, payload)
    for agent in SITES[site_id]:
        site.on_message(TOPICS.update(agent, 1), encode_message(answer(announcement, agent, root.run.run_id, sent)))
    return announcement, [decode_message(p, PartialAggregate) for _, p in tick_site(site)[1]]


def prototypes_of(root, outbox, round_number: int) -> GlobalState:  # type: ignore[no-untyped-def]
    """The prototypes published for ``round_number`` (the tick after a close publishes them)."""
    root.tick()
    return decode_message(outbox.last(TOPICS.global_state("cnn_large", round_number)), GlobalState)


def test_fedproto_over_sites_equals_flat_fedproto_over_the_same_agents(tmp_path: Path) -> None:
    flat, flat_out, _, _, _ = federation(tmp_path / "flat", with_sites=False)
    root, root_out, metrics, sites, _ = federation(tmp_path / "sites", with_sites=True)
    for round_number, seed in ((1, 0), (2, 1)):  # the first prototypes, then a round from the published ones
        sent = local_prototypes(seed)
        run_round(flat, flat_out, {}, sent)
        run_round(root, root_out, sites, sent)
        assert root.last_summary.outcome == "completed" and root.last_summary.answered == len(SAMPLES)
        assert set(root.last_summary.sites) == set(SITES)
        expected = prototypes_of(flat, flat_out, round_number + 1)
        got = prototypes_of(root, root_out, round_number + 1)
        np.testing.assert_allclose(got.prototypes, expected.prototypes, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got.prototype_counts, expected.prototype_counts)
        mean = build_aggregator(CoordinatorSettings(federation="t", enrollment="open", algorithm="fedproto")).unclipped
        plain, counts = aggregate_prototypes(mean, [p for p, _ in sent.values()], [c for _, c in sent.values()])
        np.testing.assert_allclose(got.prototypes, plain, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got.prototype_counts, counts)
    assert rejected(metrics, "bad_partial", "partial") == 0


def test_under_a_robust_rule_each_site_sends_its_rule_s_result_weighted_by_its_counts(tmp_path: Path) -> None:
    """The coordinate-wise median inside each site (and over the root's own agents), then the count-weighted mean
    across those groups: a site's poisoned agent moves only its own site's median."""
    root, outbox, metrics, sites, _ = federation(tmp_path, with_sites=True, aggregator="median")
    sent = local_prototypes(0)
    run_round(root, outbox, sites, sent)
    assert root.last_summary.outcome == "completed" and rejected(metrics, "bad_partial", "partial") == 0
    median = build_aggregator(CoordinatorSettings(federation="t", enrollment="open", algorithm="fedproto",
                                                  aggregator="median")).unclipped
    groups = [[a for a in agents if FAMILIES[a] == family] for agents in [*SITES.values(), DIRECT]
              for family in ("cnn_large", "mlp_tiny")]
    sums, counts = np.zeros_like(sent["a"][0], np.float64), np.zeros(len(sent["a"][1]), np.int64)
    for group in filter(None, groups):
        merged, totals = aggregate_prototypes(median, [sent[a][0] for a in group], [sent[a][1] for a in group])
        sums += merged.astype(np.float64) * totals[:, None]
        counts += totals
    expected = np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0)
    got = prototypes_of(root, outbox, 2)
    np.testing.assert_allclose(got.prototypes, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got.prototype_counts, counts)


@pytest.mark.parametrize("lie, why", [
    (lambda p: {"prototype_counts": p.prototype_counts * 100}, "more than the"),
    (lambda p: {"prototype_sums": p.prototype_sums[:, :-1].copy()}, "the task's prototypes"),
    (lambda p: {"prototype_sums": p.prototype_sums * 1e300}, "not finite in float32"),
    (lambda p: {"prototype_counts": np.where(np.arange(len(p.prototype_counts)) < 4, 2**62, 0).astype("<i8"),
                "prototype_sums": (np.arange(len(p.prototype_counts)) < 4)[:, None] * np.full_like(p.prototype_sums,
                                                                                                  100.0 * 2**62)},
     "more than the"),  # four classes of 2**62: their int64 sum wraps to 0
])
def test_a_site_lying_about_its_prototype_sums_is_refused_whole(tmp_path: Path, lie, why: str,  # type: ignore[no-untyped-def]
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """s3 inflates its counts (its agents would own their classes; also past int64, where a numpy sum wraps), sends
    another shape, or sums whose mean overflows float32: its partial is refused, its agents count for nothing, the
    round completes without them."""
    root, outbox, metrics, sites, clock = federation(tmp_path, with_sites=True)
    sent = local_prototypes(0)

    def edit(partial: PartialAggregate) -> PartialAggregate:
        return partial.model_copy(update=lie(partial)) if partial.site_id == "s3" else partial

    run_round(root, outbox, sites, sent, edit)
    assert rejected(metrics, "bad_partial", "partial") == 2  # s3's two families
    clock.now += 10.0  # s3's agents never answered: the deadline closes the round without them
    root.tick()
    assert why in caplog.text
    honest = {a: sent[a] for a in ("a", "b", "d", "h")}
    summary = root.last_summary
    assert summary.round == 1 and summary.outcome == "completed" and summary.answered == len(honest)
    mean = build_aggregator(CoordinatorSettings(federation="t", enrollment="open", algorithm="fedproto")).unclipped
    plain, _ = aggregate_prototypes(mean, [p for p, _ in honest.values()], [c for _, c in honest.values()])
    np.testing.assert_allclose(prototypes_of(root, outbox, 2).prototypes, plain, rtol=1e-6, atol=1e-7)


def test_prototype_sums_in_a_fedavg_round_are_refused(tmp_path: Path) -> None:
    """A FedAvg root takes no prototype sums: the partial is refused, not folded as an empty delta."""
    root, outbox, metrics, sites = setup(tmp_path, "fedavg", with_sites=True)
    run_rounds(root, outbox, sites, 1)  # the bootstrap
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site = sites["s1"]
    site.on_message(TOPICS.rounds_current, payload)
    site.on_message(TOPICS.update("a1", 2), encode_message(plain_answer(announcement, "a1", root.run.run_id)))
    (topic, sealed), = tick_site(site)[1]
    prototypes, counts = local_prototypes(0)["a"]
    partial = decode_message(sealed, PartialAggregate).model_copy(update={
        "sums": {}, "integers": {}, "heaviest": None, "prototype_sums": prototypes.astype("<f8") * 0,
        "prototype_counts": counts * 0})
    root.on_message(topic, encode_message(partial))
    assert rejected(metrics, "bad_partial", "partial") == 1


SECURE_SITES = {"s1": ["a", "d", "e"], "s2": ["b", "c", "g", "h"]}
"""Both sites hold agents of both families; nobody talks to the root directly."""
SECURE_PROTO = {**PROTO, "secure_aggregation": True, "secagg_prototype_clip": 4.0, "secagg_stage_s": 5.0,
                "round_deadline_s": 30.0}


def secure_federation(tmp_path: Path, layout: dict[str, list[str]] = SECURE_SITES,
                      claims: dict[str, int] = SAMPLES, **overrides: object):  # type: ignore[no-untyped-def]
    """Root and sites (test_site_secure's ``Federation``) under secure FedProto; ``claims``: the samples each site's
    roster reports for its agents. Round 1 announced, keys and bundles relayed: (the federation, the announcement)."""
    from tests.unit.coordinator.test_site_secure import Federation

    at_sites = {k: v for k, v in PROTO.items() if k in ("algorithm", "proto_momentum", "max_norm_ratio", "rounds")}
    fed = Federation(tmp_path, layout, FAMILIES, claims, at_sites, **{**SECURE_PROTO, **overrides})
    ann = fed.announce()
    for participant in fed.agents.values():
        participant.begin(ann)
    fed.pump()
    return fed, ann


def mask_all(fed, ann: RoundAnnouncement, sent: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:  # type: ignore[no-untyped-def]
    """Every agent's prototypes and counts into its secure participant: masked on the device, never sent plain."""
    for agent, (prototypes, counts) in sent.items():
        update = Update(run_id=ann.run_id, agent_id=agent, round=ann.round, task="train", task_ref=DIGITS,
                        family=FAMILIES[agent], base_digest=None, num_samples=SAMPLES[agent],
                        metrics=TrainMetrics(eval_accuracy=0.5, eval_loss=1.0, num_eval_samples=2),
                        prototypes=prototypes, prototype_counts=counts)
        assert fed.agents[agent].takes(update)


def test_secure_fedproto_behind_sites_gives_the_plain_prototypes_of_every_agent(tmp_path: Path) -> None:
    """Each site runs one session across its agents' families (relayed on each family's topic) and sends its
    unmasked per-class sums up under its first family's name; the root adds the sites' sums: the global prototypes
    are plain FedProto's over all seven agents, within the grid. Neither the root nor a site sees one agent's."""
    from tests.unit.coordinator.test_secure_fedproto import CLIP, plain_prototypes

    fed, ann = secure_federation(tmp_path)
    assert ann.round == 1 and ann.secure is not None and not ann.secure.families  # every session is a site's
    for site_id, agents in SECURE_SITES.items():
        held = ann.secure.sites[site_id].families
        assert sorted(held) == ["cnn_large", "mlp_tiny"] and held["cnn_large"] == held["mlp_tiny"]
        assert sorted(held["cnn_large"].roster) == sorted(agents)
    sent = local_prototypes(1)
    mask_all(fed, ann, sent)
    fed.pump()
    secured = sorted((p.site_id, p.family, p.secure, p.count) for p in fed.partials if p.round == 1)
    assert secured == [("s1", "cnn_large", True, 3), ("s2", "cnn_large", True, 4)]
    assert not any(p.prototype_sums is not None or p.sums for p in fed.partials)  # only ring sums went up
    summary = fed.root.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (1, "completed", 7), summary
    assert summary.secure["sites"] == {"s1/cnn_large": {"roster": 3, "summed": True},
                                       "s2/cnn_large": {"roster": 4, "summed": True}}
    assert {f: fs.answered for f, fs in summary.families.items()} == {"cnn_large": 4, "mlp_tiny": 3}
    fed.root.tick()
    published = decode_message(fed.outbox.last(TOPICS.global_state("mlp_tiny", 2)), GlobalState)
    expected, counts = plain_prototypes(sent)
    assert published.prototypes is not None and published.prototype_counts is not None
    assert published.prototype_counts.tolist() == counts.tolist()  # capped counts read back exactly
    step = max(quantiser(ann.secure, h.families["cnn_large"]).step for h in ann.secure.sites.values())
    held_classes = counts > 0
    assert np.abs(published.prototypes - expected)[held_classes].max() <= 2 * len(sent) * step * CLIP
    assert fed.root.run.next_round == 2


def test_a_site_inflating_its_agents_claims_and_its_secure_sum_is_capped_and_refused(tmp_path: Path) -> None:
    """s2 reports 5,000 samples for each of its three agents (its roster is its word) and adds 10,000 samples of
    class 0 to its unmasked sum on the way up. Its session's cap is the round's (the median over every selected
    agent), not the median of its own claims: at that cap its ring cannot hold the lie (at the site's own median,
    5,000, it could, and the root took it: found in review), the sum reads back as more than its agents may count,
    and is refused; the round completes at its deadline on s1's sum alone."""
    layout = {"s1": ["a", "b", "d", "e"], "s2": ["c", "g", "h"]}
    fed, ann = secure_federation(tmp_path, layout, {**SAMPLES, "c": 5000, "g": 5000, "h": 5000},
                                 claim_cap_multiple=1.0)
    assert ann.secure is not None and ann.claim_cap is not None
    s2 = ann.secure.sites["s2"].families["cnn_large"]
    assert s2.weight_cap <= ann.claim_cap < 5000
    sent = local_prototypes(1)
    mask_all(fed, ann, sent)
    held: dict[str, tuple[str, bytes]] = {}
    fed.run_sites(held)
    topic, payload = held["s2"]
    partial = decode_message(payload, PartialAggregate)
    assert partial.ring_sum is not None
    classes, dim = sent["a"][0].shape
    ring = partial.ring_sum.astype(np.int64)
    ring[classes * dim] += round(10_000 * ann.secure.clip / s2.weight_cap * quantiser(ann.secure, s2).scale)
    fed.root.on_message(*held["s1"])
    fed.root.on_message(topic, encode_message(partial.model_copy(update={"ring_sum": (ring % 2**32).astype("<u4")})))
    fed.root.tick()
    assert rejected(fed.metrics, "bad_partial", "partial") == 1
    fed.clock.now += 41  # past the deadline and the wait for sites (30 + 2 x 5 s): s2's agents never counted
    fed.root.tick()
    summary = fed.root.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (1, "completed", 4), summary
    assert summary.secure["sites"]["s2/cnn_large"]["summed"] is False
    fed.announce()  # round 2 opens with the prototypes round 1 made
    published = decode_message(fed.outbox.last(TOPICS.global_state("cnn_large", 2)), GlobalState)
    assert published.prototype_counts is not None
    assert published.prototype_counts.tolist() == sum(sent[a][1] for a in layout["s1"]).tolist()


def test_a_plain_partial_under_the_session_s_second_family_is_refused(tmp_path: Path) -> None:
    """The root waits for a site's FedProto session under its first family's name; a plain partial under another
    of its names (s1's mlp_tiny agents "accepted", no sum) is refused as ``secure_only``, and the site's real sum is
    still taken (found in review: it was taken on the plain path and settled d and e unsummed)."""
    fed, ann = secure_federation(tmp_path)
    mask_all(fed, ann, local_prototypes(1))
    held: dict[str, tuple[str, bytes]] = {}
    fed.run_sites(held)
    lie = PartialAggregate(run_id=ann.run_id, site_id="s1", round=ann.round, family="mlp_tiny", base_digest=None,
                           total_weight=0.0, count=0,
                           outcomes={a: AgentOutcome(outcome="accepted", samples=SAMPLES[a]) for a in ("d", "e")})
    fed.root.on_message(TOPICS.partial("s1", ann.round), encode_message(lie))
    assert rejected(fed.metrics, "secure_only", "partial") == 1
    fed.root.on_message(*held["s1"])
    fed.root.on_message(*held["s2"])
    fed.root.tick()
    summary = fed.root.last_summary
    assert (summary.round, summary.answered) == (1, 7), summary
    assert all(account["summed"] for account in summary.secure["sites"].values()), summary.secure


def test_a_site_counts_its_agents_for_no_more_than_the_round_s_claim_cap(tmp_path: Path) -> None:
    """With the claim cap on (the median claim, 25), s3 says its 30-sample agent c holds 1,000,000 samples, all of
    class 0: the partial's counts exceed what c counts for here (25), and it is refused."""
    root, outbox, metrics, sites, _ = federation(tmp_path, with_sites=True, claim_cap_multiple=1.0)

    def lie(partial: PartialAggregate) -> PartialAggregate:
        if partial.site_id != "s3" or partial.family != "cnn_large":
            return partial
        counts = np.zeros_like(partial.prototype_counts)
        counts[0] = 1_000_000
        sums = np.zeros_like(partial.prototype_sums)
        sums[0] = 100.0 * 1_000_000
        outcomes = {a: o.model_copy(update={"samples": 1_000_000}) for a, o in partial.outcomes.items()}
        return partial.model_copy(update={"prototype_counts": counts, "prototype_sums": sums, "outcomes": outcomes})

    announcement = run_round(root, outbox, sites, local_prototypes(0), lie)
    assert announcement.claim_cap == 25
    assert rejected(metrics, "bad_partial", "partial") == 1


def iid_prototypes(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every agent holds every class (so no class lacks holders for a robust rule over all seven)."""
    rng = np.random.default_rng(seed)
    classes, dim = local_prototypes(0)["a"][0].shape
    out = {}
    for agent, samples in SAMPLES.items():
        counts = np.full(classes, samples // classes, dtype=np.int64)
        counts[: samples % classes] += 1
        out[agent] = (rng.normal(1.0, 1.0, (classes, dim)).astype(np.float32), counts)
    return out


def test_a_site_whose_rule_lacks_holders_of_a_class_counts_none_of_those_agents(tmp_path: Path) -> None:
    """Krum at a site with one or two agents of a family (too few for it): the rule raised out of the site's close
    and the site process died; now those agents are rejected (``site_too_few``), as a site's deltas are."""
    root, outbox, _, sites, _ = federation(tmp_path, with_sites=True, aggregator="krum")
    _, partials = site_round_one(root, outbox, sites, "s3", iid_prototypes(0))
    assert {a: o.reason for p in partials for a, o in p.outcomes.items()} == dict.fromkeys(SITES["s3"], "site_too_few")
    assert all(p.prototype_sums is None and p.count == 0 for p in partials)


def test_a_robust_root_beside_sites_drops_its_own_too_few_agents_not_the_round(tmp_path: Path) -> None:
    """The median (byzantine_f 1) at the root over its one direct agent, beside sites that fold the mean: that group
    is too small for the rule and used to fail every round; now h is dropped and the sites' sums make the round."""
    root, outbox, _, sites, _ = federation(tmp_path, with_sites=True, aggregator="median", byzantine_f=1)
    for site in sites.values():  # the sites fold the mean (their own setting)
        site.rule = None
    sent = iid_prototypes(0)
    run_round(root, outbox, sites, sent)
    summary = root.last_summary
    assert summary.outcome == "completed" and summary.rejected == 1, summary
    at_sites = [a for agents in SITES.values() for a in agents]
    mean = build_aggregator(CoordinatorSettings(federation="t", enrollment="open", algorithm="fedproto")).unclipped
    plain, _ = aggregate_prototypes(mean, [sent[a][0] for a in at_sites], [sent[a][1] for a in at_sites])
    np.testing.assert_allclose(prototypes_of(root, outbox, 2).prototypes, plain, rtol=1e-6, atol=1e-6)


def test_plain_prototype_sums_in_a_secure_round_are_refused(tmp_path: Path) -> None:
    """An honest site refuses FedProto's plain updates in a secure round; a lying one's plain prototype sums are
    refused at the root (they would stand outside the round's one session)."""
    from tests.unit.coordinator.test_secure_rounds import SECURE

    root, outbox, metrics, _, _ = federation(tmp_path, with_sites=True, **{k: v for k, v in SECURE.items()
                                                                           if k not in PROTO}, secagg_prototype_clip=4.0)
    root.tick()
    announcement = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert announcement.secure is not None
    from protocol.partials import AgentOutcome

    prototypes, counts = local_prototypes(0)["a"]
    partial = PartialAggregate(run_id=root.run.run_id, site_id="s1", round=1, family="cnn_large", base_digest=None,
                               total_weight=float(SAMPLES["a"]), count=1,
                               outcomes={"a": AgentOutcome(outcome="accepted", samples=SAMPLES["a"],
                                                           weight=float(SAMPLES["a"]))},
                               prototype_sums=prototypes.astype("<f8") * counts[:, None], prototype_counts=counts)
    root.on_message(TOPICS.partial("s1", 1), encode_message(partial))
    assert rejected(metrics, "bad_partial", "partial") == 1 and "a" not in root.run.open.updates
