"""FedProto under secure aggregation: agents of two model families mask their per-class prototype sums and counts
(protocol/secagg/prototype_vector.py) from round 1, in one session across the families, and the unmasked sum gives
the global prototypes a plain round of the same survivors gives (the count-weighted mean per class, coordinator/strategies/fedproto.py), within the
quantisation step. The engine and the agents' real secure side, as in test_secure_rounds.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.aggregation.aggregator import build_aggregator
from coordinator.settings import CoordinatorSettings
from coordinator.strategies.fedproto import aggregate_prototypes
from protocol.messages import GlobalState, TrainMetrics, Update
from protocol.secagg.prototype_vector import decode_prototype_sums, encode_prototypes, prototype_length
from protocol.secagg.vector import quantiser
from protocol.secagg.wire import SecureFamily, SecureSetup
from protocol.tasks import BUILTIN_CARDS
from protocol.wire import decode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, rejected
from tests.unit.coordinator.test_secure_rounds import Fleet

CARD = BUILTIN_CARDS["digits"]
CLASSES, DIM = CARD.num_classes, CARD.embedding_dim or 0
FAMILIES = {"a": "cnn_large", "b": "cnn_large", "c": "cnn_large", "h": "cnn_large",
            "d": "mlp_tiny", "e": "mlp_tiny", "g": "mlp_tiny"}
"""Four agents in one family (a dropout leaves each survivor two neighbours: the threshold), three in the other."""
SAMPLES = {"a": 10, "b": 20, "c": 30, "h": 35, "d": 40, "e": 15, "g": 25}
CLIP = 4.0
FEDPROTO = {"algorithm": "fedproto", "secagg_prototype_clip": CLIP, "min_available_agents": 7, "min_fit_agents": 7,
            "proto_momentum": 0.0}


def proto_fleet(tmp_path: Path, **overrides: object) -> Fleet:
    return Fleet(tmp_path, families=FAMILIES, samples=SAMPLES, **{**FEDPROTO, **overrides})


def local_prototypes(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each agent's prototypes [classes, dim] and counts: 3 classes held (the others 0), counts summing to its samples."""
    rng = np.random.default_rng(seed)
    out = {}
    for agent, samples in SAMPLES.items():
        held = rng.choice(CLASSES, size=3, replace=False)
        counts = np.zeros(CLASSES, dtype=np.int64)
        counts[held] = rng.multinomial(samples - 3, [1 / 3] * 3) + 1
        prototypes = np.zeros((CLASSES, DIM), dtype=np.float32)
        prototypes[held] = rng.normal(1.0, 1.5, (3, DIM)).astype(np.float32)
        out[agent] = (prototypes, counts)
    return out


def train(fleet: Fleet, sent: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    ann = fleet.announcement()
    for agent, (prototypes, counts) in sent.items():
        plain = Update(run_id=fleet.engine.run.run_id, agent_id=agent, round=ann.round, task="train", task_ref=DIGITS,
                       family=FAMILIES[agent], base_digest=ann.states[FAMILIES[agent]].digest if ann.states else None,
                       num_samples=SAMPLES[agent], metrics=TrainMetrics(), prototypes=prototypes,
                       prototype_counts=counts)
        assert fleet.agents[agent].takes(plain)


def plain_prototypes(sent: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """What a plain FedProto round makes of the survivors' prototypes, clipped as the agents clip them."""
    settings = CoordinatorSettings(federation="t", enrollment="open", algorithm="fedproto")
    return aggregate_prototypes(build_aggregator(settings).unclipped,
                                [np.clip(p, -CLIP, CLIP) for p, _ in sent.values()], [c for _, c in sent.values()])


def state(fleet: Fleet, family: str, round_number: int) -> GlobalState:
    return decode_message(fleet.outbox.last(TOPICS.global_state(family, round_number)), GlobalState)


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_secure_fedproto_gives_the_plain_prototypes_across_families_with_a_dropout(tmp_path: Path,
                                                                                  compression: str) -> None:
    fleet = proto_fleet(tmp_path, compression=compression)
    ann = fleet.announcement()
    assert ann.round == 1 and ann.secure is not None and ann.secure.clip == CLIP  # secure from the first round
    assert sorted(ann.secure.families) == ["cnn_large", "mlp_tiny"] and ann.secure.control_clip is None
    session = ann.secure.families["cnn_large"]  # one session across the families, under each one's name
    assert ann.secure.families["mlp_tiny"] == session and session.roster == sorted(FAMILIES)
    assert session.n_params == prototype_length(CLASSES, DIM)
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()  # keys and shares: the inboxes are out
    sent = local_prototypes(0)
    held = np.flatnonzero(sent["a"][1])[0]
    sent["a"][0][held, 0] = 9.0  # beyond the clip: clipped to 4 on the device
    del sent["c"]  # c shared, then vanished before masking
    train(fleet, sent)
    fleet.pump(gone=frozenset({"c"}))
    fleet.clock.now += 31  # the masking deadline: c is dropped
    fleet.pump(gone=frozenset({"c"}))
    assert {TOPICS.parse(topic).kind for topic, _, _ in fleet.outbox.sent} >= {"secagg_relay", "secagg_inbox"}
    assert rejected(fleet.metrics, "secure_only") == 0
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (1, "completed", 6), summary
    assert list(summary.secure["families"]) == ["cnn_large+mlp_tiny"]
    assert summary.secure["families"]["cnn_large+mlp_tiny"]["survivors"] == ["a", "b", "d", "e", "g", "h"]
    assert summary.secure["families"]["cnn_large+mlp_tiny"]["recovered"]["pairwise_masks"] == ["c"]
    # The relays went to each family's topic; each survivor counts for its own family.
    relayed = {TOPICS.parse(topic).family for topic, _, _ in fleet.outbox.sent if TOPICS.parse(topic).kind == "secagg_relay"}
    assert relayed == {"cnn_large", "mlp_tiny"}
    assert {f: fs.answered for f, fs in summary.families.items()} == {"cnn_large": 3, "mlp_tiny": 3}
    fleet.engine.tick()
    published = [state(fleet, family, 2) for family in ("cnn_large", "mlp_tiny")]
    assert published[0].digest == published[1].digest and not published[0].weights  # one set, for every family
    expected, counts = plain_prototypes(sent)
    got, got_counts = published[0].prototypes, published[0].prototype_counts
    assert got is not None and got_counts is not None
    survivors = len(sent)
    # Each value is off by at most one step per agent (stochastic rounding on int8's grid), the class's weight by as
    # much over clip: the ratio by at most 2 n step / (W - n step / clip), W in weight units.
    cap, step = session.weight_cap, quantiser(ann.secure, session).step
    weight = sum(c / cap for _, (_, c) in sent.items())
    bound = 2 * survivors * step / np.maximum(weight - survivors * step / CLIP, 1e-9) + 1e-6
    held_classes = counts > 0
    assert np.all(np.abs(got - expected).max(axis=1)[held_classes] <= bound[held_classes])
    assert np.array_equal(got_counts > 0, held_classes)
    if compression == "none":
        assert got_counts.tolist() == counts.tolist()  # the fine grid reads capped counts back exactly
    else:
        assert np.abs(got_counts - counts).max() <= np.ceil(survivors * step / CLIP * cap)
    # Round 2 is secure as well, and starts from the global prototypes it names.
    following = fleet.announcement()
    assert following.round == 2 and following.secure is not None
    assert following.states["cnn_large"].digest == published[0].digest


def test_normalised_prototypes_are_masked_within_one(tmp_path: Path) -> None:
    ann = proto_fleet(tmp_path, proto_normalize=True).announcement()
    assert ann.secure is not None and ann.secure.clip == 1.0  # means of unit vectors: a finer grid than the clip


def test_a_family_with_one_selected_agent_takes_part_hidden_in_the_sum_across_families(tmp_path: Path) -> None:
    families = {**FAMILIES, "g": "cnn_small"}  # g alone in its family: a session of its own could not hide it
    fleet = Fleet(tmp_path, families=families, samples=SAMPLES, **FEDPROTO)
    ann = fleet.announcement()
    assert ann.secure is not None and sorted(ann.secure.families) == ["cnn_large", "cnn_small", "mlp_tiny"]
    assert ann.secure.families["cnn_small"] == ann.secure.families["cnn_large"]  # the same session
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = local_prototypes(1)
    train(fleet, {a: v for a, v in sent.items() if a != "g"})
    alone = Update(run_id=fleet.engine.run.run_id, agent_id="g", round=1, task="train", task_ref=DIGITS,
                   family="cnn_small", base_digest=None, num_samples=SAMPLES["g"], metrics=TrainMetrics(),
                   prototypes=sent["g"][0], prototype_counts=sent["g"][1])
    assert fleet.agents["g"].takes(alone)  # masked, never sent plain
    fleet.pump()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (1, "completed", 7), summary
    assert rejected(fleet.metrics, "secure_only") == 0
    assert summary.secure["families"]["cnn_large+cnn_small+mlp_tiny"]["survivors"] == sorted(families)
    fleet.engine.tick()
    expected, counts = plain_prototypes(sent)
    got = state(fleet, "cnn_small", 2)
    assert got.digest == state(fleet, "cnn_large", 2).digest and got.prototype_counts.tolist() == counts.tolist()
    assert np.allclose(got.prototypes[counts > 0], expected[counts > 0], atol=1e-5)


def test_the_prototype_vector_reads_back_capped_count_weighted_sums() -> None:
    family = SecureFamily(roster=["a", "b"], graph_seed=bytes(32), degree=1, threshold=1,
                          n_params=prototype_length(3, 2), weight_cap=20, ring_bits=32)
    setup = SecureSetup(clip=2.0, advertise_s=1, share_s=1, unmask_s=1, families={"f": family})
    a = (np.array([[1.0, -3.0], [0.5, 0.25], [0.0, 0.0]], np.float32), np.array([4, 30, 0]))  # 30 > cap 20
    b = (np.array([[-1.0, 1.0], [0.0, 0.0], [1.5, -0.5]], np.float32), np.array([12, 0, 7]))
    total = (encode_prototypes(*a, setup, family)[1].astype(np.uint64)
             + encode_prototypes(*b, setup, family)[1]) % (1 << 32)
    sums, counts = decode_prototype_sums(total.astype(np.uint32), 2, 3, setup, family)
    np.testing.assert_allclose(counts, [16, 20, 7], atol=1e-5)
    np.testing.assert_allclose(sums, [[4 * 1 - 12, 4 * -2.0 + 12], [20 * 0.5, 20 * 0.25], [7 * 1.5, 7 * -0.5]],
                               atol=1e-5)
    with pytest.raises(ValueError, match="the round declares"):
        encode_prototypes(np.zeros((3, 3), np.float32), np.ones(3), setup, family)
    with pytest.raises(ValueError, match="one count per row"):
        encode_prototypes(a[0], None, setup, family)
