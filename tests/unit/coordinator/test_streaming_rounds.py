"""The weighted mean folded in on receipt equals the batch rule, and the round keeps no arrays."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coordinator.aggregation import (
    AggregationError,
    UpdateStack,
    coordinate_median,
    krum,
    multi_krum,
    trimmed_mean,
    weighted_mean,
)
from coordinator.aggregation.aggregator import Aggregator
from coordinator.aggregation.rows import RowMatrix
from coordinator.aggregation.running_mean import RunningMean, combine_means
from coordinator.strategies import FedAvg, Scaffold
from coordinator.strategies.base import Strategy
from protocol.messages import TrainMetrics, Update
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import Clock, hello, make_engine, send
from tests.unit.coordinator.test_engine import update as engine_update

FAST = settings(deadline=None, max_examples=60)
values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def rows(draw: st.DrawFn) -> tuple[list[dict[str, np.ndarray]], list[float]]:
    n = draw(st.integers(1, 7))
    layout = draw(st.dictionaries(st.sampled_from("abcdef"), hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
                                  min_size=1, max_size=3))
    updates = [{name: draw(hnp.arrays(np.float32, shape, elements=values)) for name, shape in layout.items()}
               for _ in range(n)]
    for update in updates:  # an integer buffer, never averaged
        update["steps"] = np.array(draw(st.integers(0, 100)), dtype=np.int64)
    weights = draw(st.lists(st.integers(0, 10_000).map(float), min_size=n, max_size=n))
    assume(sum(weights) > 0)
    return updates, weights


@FAST
@given(rows(), st.sampled_from([None, 0.5, 100.0]), st.randoms(use_true_random=False))
def test_folding_in_any_order_equals_the_batch_rule(case: tuple[list[dict[str, np.ndarray]], list[float]],
                                                    clip: float | None, rng: object) -> None:
    updates, weights = case
    keys = [f"agent-{i:02d}" for i in range(len(updates))]
    order = list(range(len(updates)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    mean = RunningMean(clip)
    for i in order:
        mean.add(updates[i], weights[i], keys[i])
    folded = mean.result()
    batch = weighted_mean(updates, weights, clip_norm=clip)
    assert list(folded) == list(batch)
    for name in batch:
        assert folded[name].dtype == batch[name].dtype and folded[name].shape == batch[name].shape
        if batch[name].dtype.kind == "f":  # float64 sums in another order, rounded once to float32
            np.testing.assert_allclose(folded[name], batch[name], rtol=2e-7, atol=1e-6)
        else:
            np.testing.assert_array_equal(folded[name], batch[name])


def test_split_folds_combine_like_one() -> None:
    rng = np.random.default_rng(0)
    updates = [{"w": rng.normal(size=(5, 3)).astype(np.float32)} for _ in range(6)]
    weights = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    first, second = RunningMean(), RunningMean()
    for i, (update, weight) in enumerate(zip(updates, weights, strict=True)):
        (first if i % 2 else second).add(update, weight, f"a{i}")
    np.testing.assert_allclose(combine_means([first, second])["w"], weighted_mean(updates, weights)["w"], rtol=1e-6)


def test_folding_refuses_a_second_layout_and_an_empty_round() -> None:
    mean = RunningMean()
    mean.add({"w": np.zeros(3, np.float32)}, 1.0, "a")
    with pytest.raises(AggregationError, match="differ"):
        mean.add({"w": np.zeros(4, np.float32)}, 1.0, "b")
    empty = RunningMean()
    empty.add({"w": np.zeros(3, np.float32)}, 0.0, "a")
    with pytest.raises(AggregationError) as failed:
        empty.result()
    assert failed.value.reason == "no_updates"


@pytest.mark.parametrize("clip", [None, 1.0])
def test_a_factor_folds_like_the_scaled_copy_and_leaves_the_weight_alone(clip: float | None) -> None:
    """The norm gate's clip is folded in as a factor instead of a scaled copy: the same mean (to float32 rounding of
    the copy), the weight counted unscaled, a clip_norm bound measured on the scaled arrays; a factor outside
    [0, 1] is refused."""
    rng = np.random.default_rng(2)
    updates = [{"w": rng.normal(size=(5, 3)).astype(np.float32), "steps": np.array(i, np.int64)} for i in range(4)]
    factors, weights = [0.25, 1.0, 0.5, 0.8], [3.0, 1.0, 4.0, 2.0]
    folded, copied = RunningMean(clip), RunningMean(clip)
    for i, (arrays_, factor, weight) in enumerate(zip(updates, factors, weights, strict=True)):
        folded.add(arrays_, weight, f"a{i}", factor)
        copied.add({"w": arrays_["w"] * np.float32(factor), "steps": arrays_["steps"]}, weight, f"a{i}")
    assert folded.total_weight == copied.total_weight == sum(weights)
    np.testing.assert_allclose(folded.result()["w"], copied.result()["w"], rtol=1e-6, atol=1e-7)
    assert not np.allclose(folded.result()["w"], weighted_mean(updates, weights)["w"], rtol=1e-3)  # it did scale
    zero = RunningMean(clip)  # a bound of 0 (the median of zero deltas) scales a delta to nothing, as a copy did
    zero.add(updates[0], 2.0, "a", 0.0)
    assert zero.total_weight == 2.0 and not zero.result()["w"].any()
    for bad in (-0.5, 1.5, float("nan")):
        with pytest.raises(AggregationError, match="factor"):
            RunningMean(clip).add(updates[0], 1.0, "a", bad)


def update(agent: str, samples: int, base: str | None, **payload: dict[str, np.ndarray]) -> Update:
    return Update(run_id="r", agent_id=agent, round=1, task="train", task_ref=DIGITS, family="f", base_digest=base, num_samples=samples,
                  metrics=TrainMetrics(), **payload)


def arrays(rng: np.random.Generator, size: int = 4) -> dict[str, np.ndarray]:
    return {"w": rng.normal(size=(size, 2)).astype(np.float32), "b": rng.normal(size=2).astype(np.float32)}


def run_round(strategy: Strategy, updates: list[Update], round_number: int) -> list[str]:
    strategy.begin_round(len(updates))
    kept = [strategy.accumulate(u) for u in updates]
    return [d.agent_id for d in strategy.aggregate(round_number, kept)]


@pytest.mark.parametrize("clip", [None, 0.3])
def test_fedavg_streams_under_the_mean_and_matches_the_batch_path(clip: float | None) -> None:
    rng = np.random.default_rng(1)
    streaming = FedAvg(Aggregator("mean", weighted_mean, {}, clip))
    batch = FedAvg(Aggregator("mean", weighted_mean, {}, clip))
    batch.folds_payloads = False  # the same rule over every update at the close
    # Bootstrap: two agents send another layout; the majority's wins and they are dropped, on both paths.
    initial = arrays(rng)
    boot = [update(f"a{i}", 10 + i, None, weights=initial) for i in range(5)]
    boot += [update(f"x{i}", 50, None, weights=arrays(rng, size=3)) for i in range(2)]
    assert run_round(streaming, boot, 1) == run_round(batch, boot, 1) == ["x0", "x1"]
    assert streaming.folds is not None and batch.folds is None
    base = streaming.states["f"].digest
    deltas = [update(f"a{i}", 10 + i, base, delta=arrays(rng)) for i in range(5)]
    streaming.begin_round(len(deltas))
    held = [streaming.accumulate(u) for u in deltas]
    assert all(not h.delta for h in held), "a folded update keeps no arrays"
    streaming.aggregate(2, held)
    run_round(batch, deltas, 2)
    for name in ("w", "b"):
        np.testing.assert_allclose(streaming.states["f"].weights[name], batch.states["f"].weights[name], rtol=1e-6)


def test_factors_are_folded_by_a_folding_round_and_refused_by_one_that_stores_rows() -> None:
    """``accumulate`` takes the clip's factors only where it folds; a round that stores rows (a robust rule) must be
    given scaled copies, or its rows would hold unclipped deltas."""
    rng = np.random.default_rng(3)
    deltas = [arrays(rng) for _ in range(3)]
    folding = FedAvg(Aggregator("mean", weighted_mean, {}, None))
    folding.begin_round(3)
    assert folding.folding
    kept = [folding.accumulate(update(f"a{i}", 10 + i, None, delta=d), 1.0, {"delta": 0.5})
            for i, d in enumerate(deltas)]
    assert folding.folds is not None and all(not k.delta for k in kept)
    halves = [{n: a * np.float32(0.5) for n, a in d.items()} for d in deltas]
    expected = weighted_mean(halves, [10.0, 11.0, 12.0])
    for name, value in folding.folds.mean(kept, "delta").items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-7)
    median = FedAvg(Aggregator("median", coordinate_median, {}, None))
    median.begin_round(3)
    assert not median.folding
    with pytest.raises(ValueError, match="scaled copy"):
        median.accumulate(update("a0", 10, None, delta=deltas[0]), 1.0, {"delta": 0.5})


def test_scaffold_streams_weights_deltas_and_control_deltas() -> None:
    rng = np.random.default_rng(2)
    streaming, batch = Scaffold(weighted_mean), Scaffold(weighted_mean)
    batch.folds_payloads = False
    initial, control = arrays(rng), arrays(rng)
    boot = [update(f"a{i}", 5 + i, None, weights=initial, control_delta=control) for i in range(4)]
    run_round(streaming, boot, 1), run_round(batch, boot, 1)
    base = streaming.states["f"].digest
    deltas = [update(f"a{i}", 5 + i, base, delta=arrays(rng), control_delta=arrays(rng)) for i in range(4)]
    run_round(streaming, deltas, 2), run_round(batch, deltas, 2)
    for part in ("weights", "control"):
        for name in ("w", "b"):
            np.testing.assert_allclose(getattr(streaming.states["f"], part)[name],
                                       getattr(batch.states["f"], part)[name], rtol=1e-6, atol=1e-7)


def test_robust_rules_keep_the_updates() -> None:
    strategy = FedAvg(Aggregator("median", coordinate_median, {"f": 0}))
    strategy.begin_round(3)
    assert strategy.folds is None and strategy.rows is not None
    sent = [update(a, 1, None, weights={"w": np.full(2, v, np.float32), "n": np.array(v, np.int64)})
            for a, v in (("a", 2), ("b", 5), ("c", 2))]
    kept = [strategy.accumulate(u) for u in sent]
    assert [dict(k.weights)["w"].tolist() for k in kept] == [[2, 2], [5, 5], [2, 2]]
    assert [d.agent_id for d in strategy.aggregate(1, kept)] == ["b"]  # the proposal two of three sent alike
    assert strategy.states["f"].weights["w"].tolist() == [2, 2] and strategy.states["f"].weights["n"] == 2


def test_the_loop_keeps_serving_while_a_round_aggregates(tmp_path: Path) -> None:
    """Aggregation runs in the background: statuses are still handled, late updates rejected, and the
    round's summary splits its time into phases that add up to its duration."""
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock)
    release, started = threading.Event(), threading.Event()
    aggregate = engine.strategy.aggregate

    def slow_aggregate(*args: object, **kwargs: object) -> object:
        started.set()
        assert release.wait(30), "the test never released the aggregation"
        return aggregate(*args, **kwargs)

    engine.strategy.aggregate = slow_aggregate  # type: ignore[method-assign]
    with ThreadPoolExecutor(max_workers=1) as background:
        engine.background = background
        hello(engine, "a"), hello(engine, "b")
        engine.tick()
        first = engine_update(engine, "a", 1)
        send(engine, first), send(engine, engine_update(engine, "b", 1))
        engine.tick()  # closes round 1: aggregation starts in the background
        assert started.wait(30) and engine.run.closing and engine.open is None
        hello(engine, "c")  # the loop still takes statuses in
        assert engine.parts.registry.get("c") is not None
        send(engine, first.model_copy(update={"agent_id": "c"}), topic_agent="c")
        late = metrics.registry.get_sample_value("fl_messages_rejected_total", {"kind": "update", "reason": "late"})
        assert late == 1
        assert engine.tick() > 0 and engine.run.closing  # still aggregating: nothing opens
        release.set()
        while engine.run.closing:
            job = engine.closing_job
            assert job is not None
            job.result(timeout=30)
            engine.tick()
    summary = engine.last_summary
    assert summary is not None and summary.outcome == "completed" and engine.strategy.states["f"].round == 2
    phases = [summary.publish_s, summary.collect_s, summary.aggregate_s, summary.checkpoint_s]
    assert all(p is not None and p >= 0 for p in phases)
    assert summary.duration_s == pytest.approx(sum(phases), abs=0.01)  # type: ignore[arg-type]
    assert metrics.registry.get_sample_value("fl_round_phase_seconds_count", {"phase": "aggregate"}) == 1


def test_a_finished_closing_job_wakes_whoever_waits_for_input(tmp_path: Path) -> None:
    """The service's loop waits on its inbox between ticks: the closing job's end wakes it (on the job's thread),
    so the round is applied then rather than at the next poll."""
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock)
    release, woken = threading.Event(), threading.Event()
    aggregate = engine.strategy.aggregate

    def held_aggregate(*args: object, **kwargs: object) -> object:
        assert release.wait(30), "the test never released the aggregation"
        return aggregate(*args, **kwargs)

    engine.strategy.aggregate = held_aggregate  # type: ignore[method-assign]
    engine.on_job_done = woken.set
    with ThreadPoolExecutor(max_workers=1) as background:
        engine.background = background
        hello(engine, "a"), hello(engine, "b")
        engine.tick()
        send(engine, engine_update(engine, "a", 1)), send(engine, engine_update(engine, "b", 1))
        engine.tick()  # closes round 1 in the background
        assert engine.run.closing and not woken.is_set()
        release.set()
        assert woken.wait(30), "the finished job woke nobody"
        engine.tick()  # what the woken loop does first
    assert not engine.run.closing and engine.strategy.states["f"].round == 2


@pytest.mark.parametrize("budget", [1 << 30, 0], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("clip", [None, 2.0])
def test_robust_rules_read_row_matrices_exactly_like_separate_updates(tmp_path: Path, budget: int,
                                                                     clip: float | None) -> None:
    rng = np.random.default_rng(3)
    updates = [{"w": rng.normal(size=(40, 30)).astype(np.float32), "b": rng.normal(size=7).astype(np.float32),
                "n": np.array(i, np.int64)} for i in range(9)]
    weights = [float(w) for w in rng.integers(1, 50, size=9)]
    matrix = RowMatrix(updates[0], len(updates), budget_bytes=budget, spill_dir=tmp_path / "spill")
    rows = [matrix.append(u) for u in updates]
    assert matrix.spilled == (budget == 0) and any((tmp_path / "spill").glob("rows-*")) == (budget == 0)
    for rule, params in ((coordinate_median, {"f": 1}), (trimmed_mean, {"beta": 0.2, "f": 1}), (krum, {"f": 1}),
                         (multi_krum, {"f": 1, "m": 4})):
        separate = rule(updates, weights, clip_norm=clip, **params)
        from_rows = rule(rows, weights, clip_norm=clip, **params)
        for name in separate:
            np.testing.assert_array_equal(from_rows[name], separate[name], err_msg=f"{rule.__name__} {name}")
    # Small blocks that straddle the arrays' boundaries read the same values either way, clipped or not.
    from_rows, separate = (UpdateStack(u, weights, clip_norm=clip, block_bytes=4096) for u in (rows, updates))
    assert from_rows._matrix is not None and separate._matrix is None
    buffer_a, buffer_b = np.empty(4096), np.empty(4096)
    for block_a, block_b in zip(from_rows.blocks(37), separate.blocks(37), strict=True):
        np.testing.assert_array_equal(from_rows.read_rows(block_a, buffer_a, [0, 3, 8]),
                                      separate.read_rows(block_b, buffer_b, [0, 3, 8]))
        np.testing.assert_array_equal(from_rows.read_columns(block_a, buffer_a), separate.read_columns(block_b, buffer_b))
    matrix.close()
    assert not any((tmp_path / "spill").glob("rows-*")), "the spill file outlives the round"
