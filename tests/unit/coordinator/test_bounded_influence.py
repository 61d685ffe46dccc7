"""Bounded influence: the round's median norm (running, robust), the gate that holds the first deltas, and an
evaluation one agent's claim cannot take over."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import numpy as np
import pytest

from coordinator.round.norm_clip import HOLD, HOLD_MAX, NormGate, RoundNorms, RunningMedian, clipped
from coordinator.telemetry.evaluation import federated_metrics
from protocol.messages import TrainMetrics, Update
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import Clock, hello, make_engine, send, update, weights


def test_the_running_median_is_the_low_median() -> None:
    rng = random.Random(0)
    median, seen = RunningMedian(), []
    for _ in range(500):
        value = rng.choice([rng.random(), rng.random() * 1e9, 0.0])
        median.add(value), seen.append(value)
        assert median.median() == statistics.median_low(seen)  # of two middle values, the lower
    with pytest.raises(ValueError):
        RunningMedian().median()


def test_the_first_deltas_wait_for_a_median_then_one_outlier_cannot_move_it() -> None:
    gate: NormGate[str] = NormGate(RoundNorms(2.0))
    assert gate.admit("f", "attacker", 900.0) == [] and gate.admit("f", "a", 1.0) == []  # held: no median yet
    assert gate.admit("f", "b", 1.2) == [("attacker", 2.4), ("a", 2.4), ("b", 2.4)]  # 2 x median(900, 1, 1.2)
    assert gate.admit("f", "c", 0.8) == [("c", 2.0)]  # 2 x the low median of four (0.8, 1, 1.2, 900): 1
    assert gate.admit("g", "other family", 5.0) == [] and gate.release() == [("other family", 10.0)]
    assert HOLD == 3


def test_clipping_off_folds_at_once() -> None:
    gate: NormGate[str] = NormGate(RoundNorms(0.0))
    assert gate.admit("f", "a", 1e9) == [("a", None)]


def test_clipped_scales_floats_only() -> None:
    delta = {"w": np.full(4, 3.0, np.float32), "n": np.array(7, np.int64)}
    out, was = clipped(delta, 6.0, 3.0)
    assert was and out["w"].dtype == np.float32 and np.allclose(out["w"], 1.5) and out["n"] == 7
    same, was = clipped(delta, 6.0, 10.0)
    assert not was and same["w"] is delta["w"]


def evaluated(agent: str, accuracy: float, samples: int) -> Update:
    return Update(run_id="r", agent_id=agent, round=9, task="evaluate", task_ref=DIGITS, family="f", base_digest=None,
                  num_samples=0, metrics=TrainMetrics(eval_accuracy=accuracy, eval_loss=1 - accuracy,
                                                       num_eval_samples=samples))


def test_one_agent_claiming_a_million_samples_moves_the_evaluation_by_its_bounded_share() -> None:
    honest = [evaluated(a, 0.14, 120) for a in ("a", "b", "c")]
    liar = evaluated("x", 0.99, 1_000_000)
    report = federated_metrics([*honest, liar], cap_multiple=2.0)
    assert report.accuracy == pytest.approx((3 * 120 * 0.14 + 240 * 0.99) / 600)  # counted for 2 x median 120
    assert report.accuracy_median == pytest.approx(0.14) and report.accuracy_max == 0.99 and report.accuracy_min == 0.14
    # claim_cap_multiple 0 (training weights bounded only by max_samples_per_update) leaves evaluation at the default
    # bound: before, it took the counts as claimed, and the dashboard said 0.99.
    assert federated_metrics([*honest, liar], cap_multiple=0).accuracy == pytest.approx(report.accuracy)


def test_no_single_device_chooses_the_first_state() -> None:
    """Three honest proposals of the seeded initial model and one of norm 10,000 claiming 1,000,000 samples: the
    first state is the honest proposal exactly, on the streaming path as on the batch path, and the other one is
    dropped as ``bootstrap_disagrees`` (the majority rule itself: test_bootstrap_majority.py)."""
    from coordinator.aggregation import weighted_mean
    from coordinator.strategies import FedAvg

    rng = np.random.default_rng(0)
    honest = rng.normal(size=(4, 8)).astype(np.float32)
    proposals = [honest.copy() for _ in range(3)]
    proposals.append(rng.normal(scale=10_000 / np.sqrt(honest.size), size=honest.shape).astype(np.float32))
    updates = [Update(run_id="r", agent_id=f"a{i}", round=1, task="train", task_ref=DIGITS, family="f",
                      base_digest=None, num_samples=10 if i < 3 else 1_000_000, weights={"w": w},
                      metrics=TrainMetrics()) for i, w in enumerate(proposals)]
    for streaming in (True, False):
        strategy = FedAvg(weighted_mean)
        strategy.folds_payloads = streaming
        strategy.begin_round(len(updates))
        dropped = strategy.aggregate(1, [strategy.accumulate(u) for u in updates])
        assert strategy.states["f"].weights["w"].tobytes() == honest.tobytes(), streaming
        assert [(d.agent_id, d.reason.value) for d in dropped] == [("a3", "bootstrap_disagrees")]


def test_a_family_short_of_hold_norms_is_bounded_by_the_last_trusted_median() -> None:
    """An attacker alone (or with one honest agent) in a round does not set its own bound."""
    first = RoundNorms(2.0)
    for norm in (1.0, 1.2, 0.8):
        first.observe("f", norm)
    second = RoundNorms(2.0, first.carried())
    second.observe("f", 900.0)
    assert second.bound("f") == 2.0  # 2 x min(900, the last trusted median 1.0)
    second.observe("f", 1.1)
    assert second.bound("f") == 2.0  # the low median of (1.1, 900) is 1.1; the trusted 1.0 is lower
    assert RoundNorms(2.0, second.carried()).trusted == {"f": 1.0}  # two norms are not trusted: 1.0 carries on


def test_of_two_claims_the_lower_sets_the_round_s_claim_median(tmp_path: Path) -> None:
    engine, _, _ = make_engine(tmp_path, Clock())
    hello(engine, "a", samples=10), hello(engine, "b", samples=10**6)
    engine.tick()
    assert engine.run.open is not None and engine.run.open.median_claim == 10


SEVEN = ["s1", "s2", "s3", "l1", "l2", "l3", "l4"]


def _state_after_a_clipped_round(tmp_path: Path, order: list[str], restart: bool = False,
                                 sizes: tuple[float, float] = (0.1, 0.5), **overrides: object) -> np.ndarray:
    """Seven agents; in round 2 three send deltas of 0.1 a value and four of 0.5 (``sizes``; in ``order``; ``restart``:
    the coordinator restarts with round 2 open, and its agents say hello again first): the weights it ends with."""
    settings = {"max_norm_ratio": 1.0, "claim_cap_multiple": 0.0, "min_available_agents": 7, "min_fit_agents": 7,
                **overrides}
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, **settings)
    for agent_id in SEVEN:
        hello(engine, agent_id)
    engine.tick()
    for agent_id in SEVEN:
        send(engine, update(engine, agent_id, 1))
    engine.tick(), engine.tick()
    if restart:
        engine, outbox, _ = make_engine(tmp_path, clock, **settings)
        assert engine.run.open is not None and engine.run.open.number == 2
        engine.outbox = outbox
        for agent_id in SEVEN:
            hello(engine, agent_id)
    for agent_id in order:
        size = sizes[0] if agent_id.startswith("s") else sizes[1]
        send(engine, update(engine, agent_id, 2, delta={k: np.full_like(v, size) for k, v in weights(0).items()}))
    engine.tick()
    assert engine.run.next_round == 3
    return engine.strategy.states["f"].weights["w"].copy()


def test_the_clip_bound_is_the_whole_round_s_median_whatever_order_the_deltas_come_in(tmp_path: Path) -> None:
    """The median of all seven norms is a large delta's: nothing is clipped, in either order. Holding only the
    first HOLD, small deltas first clipped three of the large ones to the small ones' norm (a step of 0.16 rather
    than 0.33: the next test): the same run's model depended on who answered first."""
    small_first = _state_after_a_clipped_round(tmp_path / "a", ["s1", "s2", "s3", "l1", "l2", "l3", "l4"])
    large_first = _state_after_a_clipped_round(tmp_path / "b", ["l1", "l2", "l3", "l4", "s1", "s2", "s3"])
    np.testing.assert_allclose(small_first, large_first, rtol=1e-6)
    np.testing.assert_allclose(small_first, 1.0 + (3 * 0.1 + 4 * 0.5) / 7, rtol=1e-6)  # first state 1.0, no clip


def test_a_cohort_over_the_memory_budget_is_held_only_to_hold(tmp_path: Path) -> None:
    """With no memory for holding, the bound is the running median once HOLD deltas are in: small ones first, the
    first three large ones are clipped to 0.1 a value (the median is a small one's) and the last is not (the low
    median of seven is a large one's), so that a round of many large updates does not hold them all."""
    small_first = _state_after_a_clipped_round(tmp_path, ["s1", "s2", "s3", "l1", "l2", "l3", "l4"],
                                               aggregation_memory_mb=0)
    np.testing.assert_allclose(small_first, 1.0 + (6 * 0.1 + 0.5) / 7, rtol=1e-6)


def test_a_round_whose_median_delta_is_zero_scales_the_others_to_nothing_and_completes(tmp_path: Path) -> None:
    """Four of seven agents send zero deltas (nothing trained, or devices in concert): the round's bound is 0, so the
    three others' deltas count as zeros (a clip factor of 0) and the round still closes, the model unchanged."""
    np.testing.assert_array_equal(_state_after_a_clipped_round(tmp_path, SEVEN, sizes=(0.5, 0.0)), 1.0)


def test_the_gate_holds_a_family_s_cohort_up_to_hold_max_or_its_memory() -> None:
    gate: NormGate[int] = NormGate(RoundNorms(1.0), {"f": 5, "g": 1, "h": 10**6, "m": 10**6}, hold_bytes=1000)
    assert [gate.admit("f", i, float(i)) for i in range(4)] == [[]] * 4
    assert gate.admit("f", 4, 4.0) == [(i, 2.0) for i in range(5)]  # all five, against their median
    assert gate.admit("f", 5, 9.0) == [(5, 2.0)]  # then each as it comes (the low median of six)
    assert [gate.admit("g", i, 1.0) for i in range(HOLD)][-1] != []  # a cohort under HOLD still waits for HOLD
    assert all(gate.admit("h", i, 1.0) == [] for i in range(HOLD_MAX - 1)) and len(gate.admit("h", 0, 1.0)) == HOLD_MAX
    assert [len(gate.admit("m", i, 1.0, size=300)) for i in range(5)] == [0, 0, 0, 4, 1]  # a fourth: 1,200 bytes


def test_a_resumed_round_s_bound_does_not_depend_on_arrival_order(tmp_path: Path) -> None:
    """Resumed at start-up, the round's gate knew no agent's family yet (no status heard): it held only HOLD deltas
    and the bound depended on the order again. Selected agents of unknown family now count in every cohort."""
    small_first = _state_after_a_clipped_round(tmp_path / "a", SEVEN, restart=True)
    large_first = _state_after_a_clipped_round(tmp_path / "b", SEVEN[3:] + SEVEN[:3], restart=True)
    np.testing.assert_allclose(small_first, large_first, rtol=1e-6)


GATE_SIZE = 100


def test_what_the_gate_holds_for_cohorts_stays_within_hold_bytes_over_all_families() -> None:
    """One budget for the round, not one a family (64 families could each have held aggregation_memory_mb)."""
    families = [f"f{i}" for i in range(8)]
    gate: NormGate[int] = NormGate(RoundNorms(1.0), {f: 30 for f in families}, hold_bytes=1000)
    for family in families:
        for i in range(10):  # the tenth brings the family to 1000 bytes: still held
            gate.admit(family, i, 1.0, size=GATE_SIZE)
    held = sum(len(items) for items in gate.held.values()) * GATE_SIZE
    baseline = len(families) * HOLD * GATE_SIZE  # held before 14c9699 too, whatever the budget
    assert held - baseline <= gate.hold_bytes
