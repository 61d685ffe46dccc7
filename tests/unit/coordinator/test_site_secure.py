"""Secure aggregation inside sites: the root gives each site aggregator the sessions of its own agents
(``SecureSetup.sites``), the site relays their stages on its broker and sends up one secure partial per family with
the unmasked ring sum, and the root reads it back into the state it would have made from the same agents' plain
updates (within the quantisation step). Engines driven directly (no broker); agents run their real secure side
(edge_agent/secure.py), each hearing only its own site's relays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.sites.engine import SiteEngine
from edge_agent.secure import SecureParticipant
from protocol.messages import GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.partials import PartialAggregate
from protocol.secagg.accounting import epsilon_of, round_rdp
from protocol.secagg.vector import quantiser
from protocol.security.trust import OPEN
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, weights
from tests.unit.coordinator.test_sites import PLAIN_MEAN, site_engine, tick_site

SITES = {"s1": ["a1", "a2", "a3"], "s2": ["b1", "b2", "b3", "b4"]}
SAMPLES = {"a1": 10, "a2": 30, "a3": 5, "b1": 40, "b2": 7, "b3": 22, "b4": 9}
CLIP = 2.0
SECURE = {**PLAIN_MEAN, "secure_aggregation": True, "secagg_clip": CLIP, "secagg_stage_s": 5.0,
          "round_deadline_s": 30.0, "min_available_agents": 7, "min_fit_agents": 6, "rounds": 3}


def delta_of(agent_id: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(sum(map(ord, agent_id)))
    return {name: rng.normal(0, 1.0, a.shape).astype(np.float32) for name, a in weights(0.0).items()}


class Federation:
    """The root, its sites and their agents; ``pump`` carries messages until nothing moves (no message of one
    site's agents ever reaches another site or the root: only the sites' partials and rosters go up)."""

    def __init__(self, tmp_path: Path, layout: dict[str, list[str]] | None = None,
                 families: dict[str, str] | None = None, samples: dict[str, int] | None = None,
                 at_sites: dict[str, object] | None = None, **settings: object) -> None:
        """``layout``: site -> its agents; ``families``: agent -> family ("f" unless given); ``at_sites``: the sites'
        own settings."""
        self.clock = Clock()
        self.layout, families, samples = layout or SITES, families or {}, samples or SAMPLES
        self.root, self.outbox, self.metrics = make_engine(tmp_path, self.clock, **(settings or SECURE))
        self.sites: dict[str, SiteEngine] = {s: site_engine(tmp_path, s, self.clock, **(at_sites or {}))
                                             for s in self.layout}
        self.up: dict[str, list[tuple[str, bytes]]] = {s: [] for s in self.layout}
        self.agents = {a: SecureParticipant(a, families.get(a, "f"), TOPICS,
                                            lambda t, p, s=s: self.up[s].append((t, p)), lambda b: b)
                       for s, agents in self.layout.items() for a in agents}
        self.partials: list[PartialAggregate] = []
        for site_id, agents in self.layout.items():
            for agent_id in agents:
                hello(self.sites[site_id], agent_id, family=families.get(agent_id, "f"),  # type: ignore[arg-type]
                      samples=samples[agent_id])
            for topic, payload in self.sites[site_id].tick()[1]:  # the roster, up the bridge
                self.root.on_message(topic, payload)
        self.seen = 0

    def announce(self) -> RoundAnnouncement:
        self.root.tick()
        payload = self.outbox.last(TOPICS.rounds_current)
        for site in self.sites.values():
            site.on_message(TOPICS.rounds_current, payload)
        return decode_message(payload, RoundAnnouncement)

    def bootstrap(self) -> None:
        ann = self.announce()
        for site_id, agents in SITES.items():
            for agent_id in agents:
                update = Update(run_id=self.root.run.run_id, agent_id=agent_id, round=ann.round, task="train",
                                task_ref=DIGITS, family="f", base_digest=None, num_samples=SAMPLES[agent_id],
                                metrics=TrainMetrics(), weights=weights(1.0))
                self.sites[site_id].on_message(TOPICS.update(agent_id, ann.round), encode_message(update))
        self.pump()
        self.root.tick()

    def pump(self, gone: frozenset[str] = frozenset()) -> None:
        for _ in range(20):
            moved = False
            for site_id, site in self.sites.items():
                for topic, payload in self.up[site_id]:
                    site.on_message(topic, payload)
                moved |= bool(self.up[site_id])
                self.up[site_id].clear()
                for topic, payload in tick_site(site)[1]:
                    moved = True
                    parsed = TOPICS.parse(topic)
                    if parsed.kind == "partial":
                        self.partials.append(decode_message(payload, PartialAggregate))
                        self.root.on_message(topic, payload)
                    else:  # a relay on the site's broker: its own agents hear it
                        assert parsed.kind in ("secagg_relay", "secagg_inbox"), topic
                        for agent_id in self.layout[site_id]:
                            if agent_id not in gone:
                                self.agents[agent_id].on_message(parsed, payload, OPEN)
            self.root.tick()
            if not moved:
                return

    def train(self, ann: RoundAnnouncement, agents: list[str]) -> None:
        for agent_id in agents:
            update = Update(run_id=ann.run_id, agent_id=agent_id, round=ann.round, task="train", task_ref=DIGITS,
                            family="f", base_digest=ann.states["f"].digest, num_samples=SAMPLES[agent_id],
                            metrics=TrainMetrics(eval_accuracy=0.5, eval_loss=1.0, num_eval_samples=2),
                            delta=delta_of(agent_id))
            assert self.agents[agent_id].takes(update)

    def run_sites(self, held: dict[str, tuple[str, bytes]], keys_relays: dict[str, bytes] | None = None) -> None:
        """Carry messages between each site and its own agents until nothing moves, without the root: each site's
        partial is kept in ``held`` (site -> (topic, payload)), its keys relay in ``keys_relays`` if given."""
        for _ in range(10):
            for site_id, site in self.sites.items():
                for topic, payload in self.up[site_id]:
                    site.on_message(topic, payload)
                self.up[site_id].clear()
                for topic, payload in tick_site(site)[1]:
                    parsed = TOPICS.parse(topic)
                    if parsed.kind == "partial":
                        held[site_id] = (topic, payload)
                        continue
                    if keys_relays is not None and parsed.stage == "keys":
                        keys_relays[site_id] = payload
                    for agent_id in self.layout[site_id]:
                        self.agents[agent_id].on_message(parsed, payload, OPEN)

    def state(self, round_number: int) -> GlobalState:
        return decode_message(self.outbox.last(TOPICS.global_state("f", round_number)), GlobalState)


def test_each_site_unmasks_its_own_agents_sum_and_the_root_makes_the_plain_mean_of_all(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()  # round 1: seeded weights, in the clear through the sites
    ann = fed.announce()
    assert ann.round == 2 and ann.secure is not None and not ann.secure.families  # no agent talks to the root itself
    assert {s: sorted(held.families["f"].roster) for s, held in ann.secure.sites.items()} == SITES
    base = fed.state(2)
    for participant in fed.agents.values():
        participant.begin(ann)
    fed.pump()  # keys and bundles relayed by each site to its agents
    answering = [a for a in SAMPLES if a != "b3"]  # b3 shared, then vanished before masking
    fed.train(ann, answering)
    fed.pump(gone=frozenset({"b3"}))
    fed.clock.now += 0.8 * 30.0  # s2's deadline: b3 is dropped, its pairwise masks removed by its neighbours
    fed.pump(gone=frozenset({"b3"}))
    secured = [p for p in fed.partials if p.round == 2]
    assert [(p.site_id, p.secure, p.count) for p in secured] == [("s1", True, 3), ("s2", True, 3)]
    assert secured[1].outcomes["b3"].outcome == "straggler"
    assert not any(p.sums or any(o.weight for o in p.outcomes.values()) for p in secured)  # nothing per agent
    summary = fed.root.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (2, "completed", 6), summary
    assert summary.secure["sites"] == {"s1/f": {"roster": 3, "summed": True}, "s2/f": {"roster": 4, "summed": True}}
    assert "advertise" not in summary.secure["stages"]  # the root ran no stage of its own
    fed.root.tick()
    moved = fed.state(3)
    cap = {s: ann.secure.sites[s].families["f"].weight_cap for s in SITES}
    site_of = {a: s for s, agents in SITES.items() for a in agents}
    w = {a: min(SAMPLES[a], cap[site_of[a]]) for a in answering}
    step = max(quantiser(ann.secure, held.families["f"]).step for held in ann.secure.sites.values())
    for name in ("w", "b"):
        expected = sum(w[a] * np.clip(delta_of(a)[name].astype(np.float64), -CLIP, CLIP) for a in answering) / sum(
            w.values())
        got = moved.weights[name].astype(np.float64) - base.weights[name].astype(np.float64)
        assert np.abs(got - expected).max() <= 4 * len(answering) * step + 1e-6


def test_a_site_agent_sending_its_update_in_the_clear_is_refused_there(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    ann = fed.announce()
    plain = Update(run_id=ann.run_id, agent_id="a1", round=ann.round, task="train", task_ref=DIGITS, family="f",
                   base_digest=ann.states["f"].digest, num_samples=10, metrics=TrainMetrics(), delta=delta_of("a1"))
    fed.sites["s1"].on_message(TOPICS.update("a1", ann.round), encode_message(plain))
    assert fed.sites["s1"].metrics.registry.get_sample_value("fl_updates_total", {"outcome": "rejected"}) == 1
    held = fed.sites["s1"].round
    assert held is not None and not held.outcomes and not held.means  # nothing folded: it may still answer masked


@pytest.mark.parametrize("tampered", ["survivor outside the roster", "ring sum of another length", "inflated weight"])
def test_the_root_refuses_a_secure_partial_that_does_not_fit_its_session(tmp_path: Path, tampered: str) -> None:
    fed = Federation(tmp_path)
    fed.bootstrap()
    ann = fed.announce()
    for participant in fed.agents.values():
        participant.begin(ann)
    fed.pump()
    fed.train(ann, list(SAMPLES))
    held: dict[str, tuple[str, bytes]] = {}
    fed.run_sites(held)  # the stages, without handing the partials to the root
    topic, payload = held["s1"]
    partial = decode_message(payload, PartialAggregate)
    assert partial.ring_sum is not None
    if tampered == "survivor outside the roster":
        outcomes = {**partial.outcomes, "b1": partial.outcomes["a1"]}
        forged = partial.model_copy(update={"outcomes": outcomes, "count": partial.count + 1})
    elif tampered == "ring sum of another length":
        forged = partial.model_copy(update={"ring_sum": partial.ring_sum[:-1]})
    else:  # the weight element (the last) past what three survivors can mask: read back, it wraps below 0
        ring = partial.ring_sum.copy()
        ring[-1] = np.uint32((1 << 32) - 12345)
        forged = partial.model_copy(update={"ring_sum": ring})
    fed.root.on_message(topic, encode_message(forged))
    reason = "held_elsewhere" if tampered == "survivor outside the roster" else "bad_partial"  # b1 is s2's agent
    assert fed.metrics.registry.get_sample_value("fl_messages_rejected_total",
                                                 {"kind": "partial", "reason": reason}) == 1


def test_a_site_that_sends_no_secure_partial_counts_as_straggling_and_the_round_completes(tmp_path: Path) -> None:
    fed = Federation(tmp_path, **{**SECURE, "min_fit_agents": 4})
    fed.bootstrap()
    ann = fed.announce()
    for participant in fed.agents.values():
        participant.begin(ann)
    fed.pump()
    fed.train(ann, SITES["s1"] + SITES["s2"])
    stopped = fed.sites.pop("s1")  # s1's aggregator dies with its agents' stages half done
    fed.pump()
    assert fed.root.last_summary is None or fed.root.last_summary.round != 2  # the root waits for s1's sum ...
    fed.clock.now += 30.0 + 2 * 5.0  # ... until the round's deadline plus twice secagg_stage_s
    fed.pump()
    summary = fed.root.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (2, "completed", 4), summary
    assert summary.secure["sites"] == {"s1/f": {"roster": 3, "summed": False}, "s2/f": {"roster": 4, "summed": True}}
    assert stopped.round is not None  # it never closed: nothing of it reached the root


def test_distributed_dp_behind_sites_is_announced_to_every_site_and_accounted_for_each_sum(tmp_path: Path) -> None:
    fed = Federation(tmp_path, **SECURE, secagg_noise_multiplier=0.5, secagg_dp_clip_norm=1.0)
    fed.bootstrap()
    ann = fed.announce()
    assert ann.secure is not None and ann.secure.noise is not None and ann.secure.noise.mechanism == "skellam"
    assert ann.secure.noise.shares == min(h.families["f"].threshold for h in ann.secure.sites.values())
    for participant in fed.agents.values():
        participant.begin(ann)
    fed.pump()
    fed.train(ann, list(SAMPLES))
    fed.pump()
    summary = fed.root.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (2, "completed", 7), summary
    expected = epsilon_of(round_rdp(ann.secure, [h.families["f"] for h in ann.secure.sites.values()]), 1e-5)[0]
    assert summary.secure["noise"]["rounds"] == 1 and summary.secure["noise"]["epsilon"] == pytest.approx(expected)
