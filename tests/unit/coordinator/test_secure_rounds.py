"""Secure rounds (coordinator/round/secure.py) driven in one process: the engine with a fake clock, and
the agents' real side (edge_agent/secure.py), messages handed over as the broker would carry them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from edge_agent.secure import SecureParticipant
from protocol.messages import GlobalState, RoundAnnouncement, TrainMetrics, Update
from protocol.secagg.vector import quantiser
from protocol.secagg.wire import SecureMasked, SecureReveal
from protocol.security.trust import OPEN
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, rejected, send, update, weights

AGENTS = ("a", "b", "c", "d")
SAMPLES = {"a": 10, "b": 20, "c": 30, "d": 40}
SECURE = {"secure_aggregation": True, "max_norm_ratio": 0, "claim_cap_multiple": 0, "min_available_agents": 4,
          "min_fit_agents": 4, "secagg_clip": 2.0, "secagg_stage_s": 5.0, "round_deadline_s": 30.0}


class Fleet:
    """The engine and its secure participants (four of family f unless ``families`` says whose family is which);
    ``pump`` carries messages both ways until nothing moves."""

    def __init__(self, tmp_path: Path, bootstrap: dict[str, object] | None = None,
                 families: dict[str, str] | None = None, samples: dict[str, int] | None = None,
                 **overrides: object) -> None:
        """``bootstrap``: what each agent sends in round 1 beside the seeded weights (SCAFFOLD's control delta).
        Under FedProto there is no plain round 1: its prototypes are learned from data, so round 1 is secure."""
        self.clock = Clock()
        self.engine, self.outbox, self.metrics = make_engine(tmp_path, self.clock, **{**SECURE, **overrides})
        self.up: list[tuple[str, bytes]] = []
        self.seen = 0
        self.families = families or {a: "f" for a in AGENTS}
        self.samples = samples or SAMPLES
        self.agents = {a: SecureParticipant(a, family, TOPICS, lambda t, p: self.up.append((t, p)), lambda b: b)
                       for a, family in self.families.items()}
        for agent, family in self.families.items():
            hello(self.engine, agent, family=family, samples=self.samples[agent])
        self.engine.tick()
        if overrides.get("algorithm") == "fedproto":
            return
        for agent in self.families:  # round 1 bootstraps, in the clear (seeded weights, nothing learned)
            send(self.engine, update(self.engine, agent, 1, samples=self.samples[agent], weights=weights(1.0),
                                     **(bootstrap or {})))
        self.engine.tick(), self.engine.tick()

    def announcement(self) -> RoundAnnouncement:
        return decode_message(self.outbox.last(TOPICS.rounds_current), RoundAnnouncement)

    def pump(self, gone: frozenset[str] = frozenset()) -> None:
        """Deliver agents' messages to the engine and the engine's relays to the agents not ``gone``."""
        for _ in range(10):
            moved = bool(self.up)
            for topic, payload in self.up:
                self.engine.on_message(topic, payload)
            self.up.clear()
            self.engine.tick()
            for topic, payload, _ in self.outbox.sent[self.seen:]:
                parsed = TOPICS.parse(topic)
                if parsed.kind in ("secagg_relay", "secagg_inbox"):
                    moved = True
                    for agent, participant in self.agents.items():
                        if agent not in gone:
                            participant.on_message(parsed, payload, OPEN)
            self.seen = len(self.outbox.sent)
            if not moved:
                return

    def train(self, deltas: dict[str, dict[str, np.ndarray]], round_number: int = 2,
              controls: dict[str, dict[str, np.ndarray]] | None = None) -> None:
        for agent, delta in deltas.items():
            extra = {"control_delta": controls[agent]} if controls is not None else {}
            plain = update(self.engine, agent, round_number, samples=self.samples[agent], delta=delta, **extra)
            assert self.agents[agent].takes(plain)

    def state(self, round_number: int) -> GlobalState:
        return decode_message(self.outbox.last(TOPICS.global_state("f", round_number)), GlobalState)


def deltas(seed: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {a: {"w": rng.normal(0, 1.0, (2, 3)).astype(np.float32), "b": rng.normal(0, 1.0, 3).astype(np.float32)}
            for a in AGENTS}


def plain_mean(sent: dict[str, dict[str, np.ndarray]], clip: float) -> dict[str, np.ndarray]:
    total = sum(SAMPLES[a] for a in sent)
    return {name: sum(np.clip(d[name].astype(np.float64), -clip, clip) * SAMPLES[a] for a, d in sent.items()) / total
            for name in ("w", "b")}


def test_the_unmasked_mean_equals_the_plain_mean_and_a_silent_survivors_mask_is_recovered(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ann = fleet.announcement()
    assert ann.round == 2 and ann.secure is not None
    session = ann.secure.families["f"]
    assert session.roster == list(AGENTS) and (session.degree, session.threshold) == (3, 2)
    base = fleet.state(2)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = deltas(0)
    sent["a"]["w"][0, 0] = 7.0  # clipped to 2 on the device
    fleet.train(sent)
    fleet.pump(gone=frozenset({"d"}))  # d uploaded its masked input, then went silent: no reveal from it
    summary = fleet.engine.last_summary  # the others' reveals hold every secret: d is not waited for
    assert (summary.round, summary.outcome) == (2, "completed"), summary
    assert summary.answered == 4
    secure = summary.secure["families"]["f"]
    assert secure["survivors"] == list(AGENTS)
    assert secure["recovered"] == {"self_masks": ["d"], "pairwise_masks": []}
    assert secure["dropped"]["unmask"] == ["d"]
    fleet.engine.tick()
    new = fleet.state(3)
    step = quantiser(ann.secure, session).step
    # Each value is off by at most half a step per agent, the weight by as much (a few steps in all), and
    # the new state is float32 around 1.0 (one ulp, 2^-23).
    for name, mean in plain_mean(sent, 2.0).items():
        np.testing.assert_allclose(new.weights[name] - base.weights[name], mean, atol=8 * step + 2**-23, rtol=0)
    assert fleet.metrics.registry.get_sample_value("fl_secagg_stage_seconds_count", {"stage": "unmask"}) == 1
    assert fleet.metrics.registry.get_sample_value("fl_secagg_dropouts_total", {"stage": "unmask"}) == 1
    assert fleet.metrics.registry.get_sample_value("fl_secagg_bytes_total", {"stage": "mask", "direction": "in"}) > 0


def test_aes_ctr_masks_are_announced_and_unmask_to_the_plain_mean(tmp_path: Path) -> None:
    """secagg_prg aes-ctr: the announcement names it, and agents and coordinator both expand masks with it (a
    mismatch would leave the masks in the sum, far past the bound)."""
    fleet = Fleet(tmp_path, secagg_prg="aes-ctr")
    ann, base = fleet.announcement(), fleet.state(2)
    assert ann.secure is not None and ann.secure.prg == "aes-ctr"
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = deltas(3)
    fleet.train(sent)
    fleet.pump()
    assert (fleet.engine.last_summary.round, fleet.engine.last_summary.outcome) == (2, "completed")
    fleet.engine.tick()
    step = quantiser(ann.secure, ann.secure.families["f"]).step
    for name, mean in plain_mean(sent, 2.0).items():
        np.testing.assert_allclose(fleet.state(3).weights[name] - base.weights[name], mean, atol=8 * step + 2**-23,
                                   rtol=0)


def test_an_unknown_prg_is_refused_at_start_up_naming_the_setting() -> None:
    with pytest.raises(ValidationError, match="secagg_prg"):
        CoordinatorSettings(secure_aggregation=True, secagg_prg="aes256ctr")  # type: ignore[arg-type]


def test_an_agent_dropped_after_sharing_has_its_pairwise_masks_removed(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ann, base = fleet.announcement(), fleet.state(2)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()  # keys and shares: the inboxes are out
    sent = deltas(1)
    del sent["c"]  # c shared, then vanished before masking
    fleet.train(sent)
    fleet.pump(gone=frozenset({"c"}))
    fleet.clock.now += 31  # the masking deadline: c is dropped
    fleet.pump(gone=frozenset({"c"}))
    summary = fleet.engine.last_summary
    assert summary.outcome == "completed" and summary.secure["families"]["f"]["recovered"]["pairwise_masks"] == ["c"]
    fleet.engine.tick()
    for name, mean in plain_mean(sent, 2.0).items():
        np.testing.assert_allclose(fleet.state(3).weights[name] - base.weights[name], mean, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox"])
def test_an_agent_dropped_after_advertising_is_left_out_of_the_masks(tmp_path: Path, algorithm: str) -> None:
    fleet = Fleet(tmp_path, algorithm=algorithm)
    ann, base = fleet.announcement(), fleet.state(2)
    assert ann.algorithm == algorithm
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump(gone=frozenset({"b"}))  # b advertised, then never saw the keys: it shares nothing
    fleet.clock.now += 10.0  # the sharing deadline
    fleet.pump(gone=frozenset({"b"}))
    sent = deltas(3)
    del sent["b"]
    fleet.train(sent)
    fleet.pump(gone=frozenset({"b"}))
    summary = fleet.engine.last_summary
    assert summary.outcome == "completed" and summary.answered == 3
    account = summary.secure["families"]["f"]
    assert account["dropped"]["share"] == ["b"] and account["recovered"] == {"self_masks": [], "pairwise_masks": []}
    fleet.engine.tick()
    for name, mean in plain_mean(sent, 2.0).items():
        np.testing.assert_allclose(fleet.state(3).weights[name] - base.weights[name], mean, atol=1e-6)


def test_a_round_under_the_threshold_fails_with_its_reason_and_changes_nothing(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ann = fleet.announcement()
    fleet.agents["a"].begin(ann)  # only one agent advertises: 1 < threshold 2
    fleet.pump()
    assert fleet.engine.last_summary.round == 1
    fleet.clock.now += 5.0  # the advertising deadline
    fleet.pump()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.reason) == (2, "failed", "secure_aggregation")
    assert "fewer than the threshold 2" in summary.detail and summary.answered == 0
    fleet.engine.tick()
    assert fleet.announcement().round == 3 and fleet.announcement().states["f"].digest == ann.states["f"].digest
    assert not [t for t, _, _ in fleet.outbox.sent if "secagg_relay" in t or "secagg_inbox" in t]  # nothing relayed


def test_too_few_reveals_fail_the_round_at_the_unmasking_deadline(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ann, base = fleet.announcement(), fleet.state(2)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    fleet.train(deltas(4))
    fleet.pump(gone=frozenset({"c", "d"}))  # both uploaded, neither reveals: a's and b's seeds have one share each
    assert fleet.engine.last_summary.round == 1  # still waiting for reveals
    fleet.clock.now += 5.0
    fleet.pump()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (2, "failed", 0)
    assert "fewer than the threshold 2" in summary.detail
    fleet.engine.tick()
    assert fleet.announcement().states["f"].digest == base.digest  # nothing of the sum was folded in


def test_late_and_plain_answers_are_refused(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    plain = update(fleet.engine, "a", 2, samples=10, delta=weights(0.5))
    send(fleet.engine, plain)
    assert rejected(fleet.metrics, "secure_only") == 1
    sent = deltas(2)
    late = {"b": sent.pop("b")}
    fleet.train(sent)
    fleet.pump(gone=frozenset({"b"}))
    fleet.clock.now += 31  # masking closes without b
    fleet.pump(gone=frozenset({"b"}))
    assert fleet.engine.last_summary.outcome == "completed"
    fleet.train(late)  # b's masked input after its stage closed
    fleet.pump()
    assert rejected(fleet.metrics, "late", kind="secagg") == 1


def test_a_new_family_bootstraps_in_the_clear_beside_the_secure_session(tmp_path: Path) -> None:
    """A device claiming a family without a state must not turn the round plain for everyone: f's session runs,
    the new family's seeded weights come plainly, and only those (its deltas could not come before a state)."""
    fleet = Fleet(tmp_path, rounds=4)
    for agent, samples in (("g1", 12), ("g2", 18)):  # they join during round 2, for round 3
        hello(fleet.engine, agent, family="g", samples=samples)
        fleet.agents[agent] = SecureParticipant(agent, "g", TOPICS, lambda t, p: fleet.up.append((t, p)), lambda b: b)
    second = fleet.announcement()
    for agent in AGENTS:
        fleet.agents[agent].begin(second)
    fleet.pump()
    fleet.train(deltas(4))
    fleet.pump()
    assert (fleet.engine.last_summary.round, fleet.engine.last_summary.outcome) == (2, "completed")
    fleet.engine.tick()
    ann, base = fleet.announcement(), fleet.state(3)
    assert ann.round == 3 and sorted(ann.selected) == sorted([*AGENTS, "g1", "g2"])
    assert ann.secure is not None and sorted(ann.secure.families) == ["f"]
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = deltas(5)
    fleet.train(sent, round_number=3)
    for agent in ("g1", "g2"):
        proposal = Update(run_id=fleet.engine.run.run_id, agent_id=agent, round=3, task="train", task_ref=DIGITS,
                          family="g", base_digest=None, num_samples=10, metrics=TrainMetrics(), weights=weights(3.0))
        assert not fleet.agents[agent].takes(proposal)  # no session for g: its agent sends it plainly
        send(fleet.engine, proposal)
    smuggled = Update(run_id=fleet.engine.run.run_id, agent_id="g1", round=3, task="train", task_ref=DIGITS,
                      family="g", base_digest=None, num_samples=10, metrics=TrainMetrics(), delta=weights(0.5))
    send(fleet.engine, smuggled)  # a delta in the clear is refused in a secure round, whatever the family
    assert rejected(fleet.metrics, "secure_only") == 1
    fleet.pump()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (3, "completed", 6), summary
    fleet.engine.tick()
    for name, mean in plain_mean(sent, 2.0).items():
        np.testing.assert_allclose(fleet.state(4).weights[name] - base.weights[name], mean, atol=1e-6)
    new_family = decode_message(fleet.outbox.last(TOPICS.global_state("g", 4)), GlobalState)
    np.testing.assert_array_equal(new_family.weights["w"], weights(3.0)["w"])  # the agreed proposal, exactly
    following = fleet.announcement()
    assert following.round == 4 and sorted(following.secure.families) == ["f", "g"]  # g secure from now on


def test_a_reveal_of_both_shares_for_one_agent_does_not_decode() -> None:
    share = np.zeros(8, dtype=np.uint32)
    reveal = {"run_id": "r", "round": 3, "agent_id": "a", "self_mask_shares": {"b": share}, "key_shares": {"b": share}}
    with pytest.raises(ValidationError, match="both shares"):
        SecureReveal(**reveal)


@pytest.mark.parametrize("compression, bits", [("int8", 10), ("fp16", 14)])
def test_compression_lives_in_the_ring_and_the_mean_stays_within_its_step(tmp_path: Path, compression: str,
                                                                           bits: int) -> None:
    """int8 (fp16): each value on a grid of 127 (2047) levels at the clip; 4 agents' sums need 10 (14) bits,
    so each masked element travels in that many bits, not 32, and the unmasked mean is within the grid's step."""
    fleet = Fleet(tmp_path, compression=compression)
    ann, base = fleet.announcement(), fleet.state(2)
    assert ann.secure is not None and ann.compression == "none"  # agents quantise in the ring, pack nothing
    session = ann.secure.families["f"]
    assert session.ring_bits == bits and ann.secure.levels == {"int8": 127, "fp16": 2047}[compression]
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = deltas(5)
    fleet.train(sent)
    masked = [decode_message(p, SecureMasked) for t, p in fleet.up if t.endswith("/masked")]
    assert len(masked) == 4 and all(m.masked.nbytes == 4 * -(-session.n_params * bits // 32) for m in masked)
    fleet.pump()
    assert fleet.engine.last_summary.outcome == "completed"
    fleet.engine.tick()
    new = fleet.state(3)
    step = quantiser(ann.secure, session).step
    assert step == pytest.approx(2.0 / ann.secure.levels)
    for name, mean in plain_mean(sent, 2.0).items():
        np.testing.assert_allclose(new.weights[name] - base.weights[name], mean, atol=8 * step, rtol=0)


def test_top_k_is_refused_at_start_up_with_its_reason() -> None:
    with pytest.raises(ValidationError, match="sparse masked upload shows which"):
        CoordinatorSettings(**{**SECURE, "enrollment": "open", "compression": "topk:0.1", "momentum": 0.0})
    for compression in ("int8", "fp16"):
        assert CoordinatorSettings(**{**SECURE, "enrollment": "open", "compression": compression}).compression


@pytest.mark.parametrize("override, named", [
    ({"aggregator": "median"}, "aggregator median"),
    ({"max_norm_ratio": 1.0}, "max_norm_ratio"),
    ({"weighting": "kl"}, "weighting kl"),
    ({"clip_norm": 1.0}, "clip_norm"),
])
def test_rules_that_need_individual_updates_are_refused_at_start_up(override: dict, named: str) -> None:
    fields = {**SECURE, "enrollment": "open", **override}
    with pytest.raises(ValidationError) as caught:
        CoordinatorSettings(**fields)
    assert "secure_aggregation" in str(caught.value) and named in str(caught.value)


def test_a_restart_during_a_secure_round_fails_that_round_and_goes_on(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()  # the coordinator "dies" with the inboxes out and its running sum in memory
    again, _, _ = make_engine(tmp_path, fleet.clock, **SECURE)
    assert again.open is not None and again.open.number == 2
    again.tick()
    summary = again.last_summary
    assert (summary.round, summary.outcome, summary.reason) == (2, "failed", "secure_aggregation")
    assert "restarted during the round" in summary.detail and summary.answered == 0
    for agent in AGENTS:  # their heartbeats reach the new process
        hello(again, agent, samples=SAMPLES[agent])
    again.tick()
    assert again.open is not None and again.open.number == 3 and again.open.announcement.secure is not None


def test_a_threshold_the_roster_cannot_meet_fails_the_round_with_its_reason(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, secagg_threshold=4)  # four agents have three neighbours each at most
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome) == (1, "completed")  # the bootstrap is plain
    fleet.engine.tick()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.reason) == (2, "failed", "secure_aggregation")
    assert "fewer than secagg_threshold 4" in summary.detail


def test_a_masked_input_past_every_bound_fails_the_round_instead_of_moving_the_model(tmp_path: Path) -> None:
    """One agent's masked input can be anything in the ring (the coordinator never sees it unmasked): the unmasked
    sum is checked against what the survivors' clipped inputs can add up to, and an implausible one fails the
    round with nothing folded."""
    fleet = Fleet(tmp_path)
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    fleet.train(deltas(0))
    forged = 0
    for i, (topic, payload) in enumerate(fleet.up):
        if TOPICS.parse(topic).agent_id == "d" and TOPICS.parse(topic).stage == "masked":
            message = decode_message(payload, SecureMasked)
            masked = np.array(message.masked, copy=True)
            np.add(masked[:1], np.uint32(1 << 30), out=masked[:1])  # far past clip x weight; the ring wraps, silently
            fleet.up[i] = (topic, encode_message(message.model_copy(update={"masked": masked})))
            forged += 1
    assert forged == 1
    fleet.pump()  # every stage answered: the round ends without waiting for a deadline
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.reason) == (2, "failed", "secure_aggregation")
    assert "unmasked sum is refused" in summary.detail
    assert fleet.engine.strategy.states["f"].round == 2  # nothing applied
