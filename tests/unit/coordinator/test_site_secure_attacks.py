"""A lying site aggregator in a secure round behind sites: what it sends is refused whole and counted, never
crashes the root, never settles another site's agents, never inflates the mean, and never pulls another site's
agent into its own session. Engines driven directly (tests/unit/coordinator/test_site_secure.py's federation);
each forged partial starts from the site's genuine one, signed as the site would (trust is open here: the intake's
signature check is tested elsewhere)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protocol.messages import RoundAnnouncement
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.security.trust import OPEN
from protocol.site_rosters import SiteRoster
from protocol.wire import decode_message, encode_message
from tests.unit.coordinator.test_engine import TOPICS
from tests.unit.coordinator.test_site_secure import SAMPLES, SECURE, SITES, Federation
from tests.unit.coordinator.test_sites import tick_site

DEADLINE_S = 30.0 + 2 * 5.0  # the round's deadline, then twice secagg_stage_s for the sites' sums


def genuine_partials(fed: Federation, keys_relays: dict[str, bytes] | None = None,
                     ) -> tuple[RoundAnnouncement, dict[str, tuple[str, PartialAggregate]]]:
    """Round 2's stages run at both sites; each site's partial, held back from the root (and, into ``keys_relays``,
    each site's keys relay)."""
    ann = fed.announce()
    for participant in fed.agents.values():
        participant.begin(ann)
    held: dict[str, tuple[str, bytes]] = {}
    fed.run_sites(held, keys_relays)  # keys and bundles, each site to its own agents
    fed.train(ann, list(SAMPLES))
    fed.run_sites(held, keys_relays)  # masked inputs, the unmasking request, reveals: the partials
    assert set(held) == set(SITES)
    return ann, {site: (topic, decode_message(payload, PartialAggregate)) for site, (topic, payload) in held.items()}


def send(fed: Federation, topic: str, partial: PartialAggregate) -> None:
    fed.root.on_message(topic, encode_message(partial))


def refused(fed: Federation, reason: str, kind: str = "partial") -> float:
    return fed.metrics.registry.get_sample_value("fl_messages_rejected_total", {"kind": kind, "reason": reason}) or 0


def with_weight(partial: PartialAggregate, steps: int) -> PartialAggregate:
    """The same ring sum with its weight element set to ``steps`` grid steps."""
    assert partial.ring_sum is not None
    ring = partial.ring_sum.copy()
    ring[-1] = steps
    return partial.model_copy(update={"ring_sum": ring})


def close(fed: Federation) -> None:
    fed.pump()
    fed.clock.now += DEADLINE_S
    fed.pump()


def genuine_ones_complete_the_round(fed: Federation, held: dict[str, tuple[str, PartialAggregate]]) -> None:
    """Both sites' genuine partials, sent after a forged one was refused, still make round 2 whole."""
    send(fed, *held["s1"])
    send(fed, *held["s2"])
    close(fed)
    summary = fed.root.last_summary
    assert summary is not None and (summary.round, summary.outcome, summary.answered) == (2, "completed", 7)
    assert summary.secure["sites"] == {"s1/f": {"roster": 3, "summed": True}, "s2/f": {"roster": 4, "summed": True}}


def test_a_zero_weight_is_refused_not_raised(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    _, held = genuine_partials(fed)
    topic, partial = held["s1"]
    send(fed, topic, with_weight(partial, 0))  # used to raise AggregationError out of the root's loop
    assert refused(fed, "bad_partial") == 1


def test_a_shrunk_weight_cannot_inflate_the_mean(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    ann, held = genuine_partials(fed)
    before = fed.state(2)
    for topic, partial in held.values():
        send(fed, topic, with_weight(partial, 1))  # one grid step of weight under the genuine sums: a huge mean
    assert refused(fed, "bad_partial") == 2
    close(fed)
    summary = fed.root.last_summary
    assert summary is not None and summary.round == 2 and summary.outcome != "completed"
    assert summary.secure["sites"] == {"s1/f": {"roster": 3, "summed": False}, "s2/f": {"roster": 4, "summed": False}}
    assert fed.root.strategy.states["f"].weights.keys() == before.weights.keys()
    for name, array in fed.root.strategy.states["f"].weights.items():
        assert np.array_equal(array, before.weights[name]), name  # nothing of the refused sums was applied


def test_a_site_cannot_settle_another_sites_agents(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    _, held = genuine_partials(fed)
    topic, partial = held["s1"]
    stragglers = {agent: AgentOutcome(outcome="straggler") for agent in SITES["s2"]}
    send(fed, topic, partial.model_copy(update={"outcomes": {**partial.outcomes, **stragglers}}))
    assert refused(fed, "held_elsewhere") == 1  # admission: s2's agents are bound to s2
    genuine_ones_complete_the_round(fed, held)


def test_an_empty_secure_partial_from_a_site_without_a_session_settles_nobody(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    _, held = genuine_partials(fed)
    _, partial = held["s1"]
    forged = partial.model_copy(update={"site_id": "s9", "count": 0, "ring_sum": np.zeros(1, np.uint32),
                                        "outcomes": {b: AgentOutcome(outcome="straggler") for b in SITES["s2"]}})
    send(fed, TOPICS.partial("s9", partial.round), forged)
    assert refused(fed, "held_elsewhere") == 1  # s2's agents, not s9's
    open_round = fed.root.run.open
    assert open_round is not None and not open_round.settled and not open_round.partials


def test_a_sum_of_fewer_survivors_than_the_threshold_is_refused(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    ann, held = genuine_partials(fed)
    topic, partial = held["s2"]
    session = ann.secure.sites["s2"].families["f"]
    assert session.threshold >= 2
    outcomes = {agent: AgentOutcome(outcome="straggler") for agent in session.roster}
    outcomes[session.roster[0]] = partial.outcomes[session.roster[0]]  # one survivor: its own input, unmasked
    send(fed, topic, partial.model_copy(update={"count": 1, "outcomes": outcomes}))
    assert refused(fed, "bad_partial") == 1


def test_a_plain_partial_for_a_secure_session_is_refused_and_the_genuine_sum_still_counts(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    ann, held = genuine_partials(fed)
    topic, partial = held["s1"]
    cap = ann.secure.sites["s1"].families["f"].weight_cap
    like = fed.state(2).weights
    claimed = float(cap * 50)  # far past the session's cap: what a plain partial would have got away with
    plain = PartialAggregate(run_id=partial.run_id, epoch=partial.epoch, site_id="s1", round=partial.round,
                             family="f", base_digest=partial.base_digest,
                             sums={n: np.full(a.shape, claimed * 1e-3, np.float64) for n, a in like.items()
                                   if a.dtype.kind == "f"},
                             heaviest="a1", total_weight=claimed, count=1,
                             outcomes={"a1": AgentOutcome(outcome="accepted", samples=cap * 50, weight=claimed),
                                       "a2": AgentOutcome(outcome="straggler"), "a3": AgentOutcome(outcome="straggler")})
    send(fed, topic, plain)
    assert refused(fed, "secure_only") == 1
    genuine_ones_complete_the_round(fed, held)


def test_a_site_cannot_pull_another_sites_live_agent_into_its_session(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    claim = SiteRoster(site_id="s2", started_at=1e12, seq=1, present=["a1", *SITES["s2"]])  # a1 is live behind s1
    fed.root.on_message(TOPICS.site_roster("s2"), encode_message(claim))
    assert refused(fed, "held_elsewhere", kind="site_roster") == 1
    assert fed.root.parts.rosters.site_of["a1"] == "s1"
    fed.bootstrap()
    ann = fed.announce()
    assert {s: sorted(h.families["f"].roster) for s, h in ann.secure.sites.items()} == SITES


def test_a_sum_read_and_then_refused_is_still_charged_to_the_privacy_ledger(tmp_path: Path) -> None:
    fed = Federation(tmp_path, **SECURE, secagg_noise_multiplier=0.5, secagg_dp_clip_norm=1.0)
    fed.bootstrap()
    _, held = genuine_partials(fed)
    topic, partial = held["s1"]
    send(fed, topic, with_weight(partial, 1))  # decoded (the noisy sum is seen), then refused as implausible
    assert refused(fed, "bad_partial") == 1
    close(fed)
    summary = fed.root.last_summary
    assert summary is not None and summary.round == 2 and summary.outcome != "completed"
    assert summary.secure["noise"]["rounds"] == 1  # the sum was released to the root even though nothing folded


def test_an_agent_takes_a_relay_for_the_round_it_is_signed_for_not_the_one_its_topic_names(tmp_path: Path) -> None:
    """A genuine round-2 keys relay, republished on round 3's topic, is not round 3's: the agent waits for the real
    one (it used to take the topic's round, and could be made to share, or reveal, against another round's view)."""
    fed = Federation(tmp_path)
    fed.bootstrap()
    replayable: dict[str, bytes] = {}
    _, held = genuine_partials(fed, replayable)
    kept: list[tuple[str, bytes]] = []
    for topic, partial in held.values():
        send(fed, topic, partial)
    close(fed)
    ann = fed.announce()
    assert ann.round == 3
    for participant in fed.agents.values():
        participant.begin(ann)
    site = fed.sites["s1"]
    for topic, payload in fed.up["s1"]:
        site.on_message(topic, payload)
    fed.up["s1"].clear()
    for topic, payload in tick_site(site)[1]:
        if TOPICS.parse(topic).stage == "keys":
            kept.append((topic, payload))
    assert len(kept) == 1, "the site relayed round 3's keys once its agents advertised"
    keys_topic, keys_payload = kept[0]
    fed.agents["a1"].on_message(TOPICS.parse(keys_topic), replayable["s1"], OPEN)  # round 2's, genuine
    assert not fed.up["s1"], "the agent shared against round 2's advertisements"
    fed.agents["a1"].on_message(TOPICS.parse(keys_topic), keys_payload, OPEN)
    assert [TOPICS.parse(t).stage for t, _ in fed.up["s1"]] == ["shares"]
