"""Label heterogeneity: KL to the federation's distribution, weight factors, the running sum, the gauges."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from coordinator.telemetry.heterogeneity import MAX_AGENT_SAMPLES, MAX_DEVICE_LABELS, HeterogeneityMetrics, LabelSkew
from protocol.messages import AgentStatus, TaskRef


def observe(skew: LabelSkew, agent: str, counts: list[int] | None, device: str = "rpi",
            num_samples: int | None = None) -> None:
    array = None if counts is None else np.array(counts, dtype=np.int64)
    n = num_samples if num_samples is not None else (sum(counts) if counts is not None else 0)
    skew.observe(agent, device=device, num_samples=n, label_counts=array)


def hand_kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True) if pi > 0)


# -- KL and the federation's distribution -----------------------------------------------------
def test_kl_matches_a_hand_computation_with_add_one_smoothing() -> None:
    skew = LabelSkew()
    observe(skew, "a", [8, 2, 0])
    observe(skew, "b", [0, 5, 5])
    # federation counts [8, 7, 5] + 1 each over 20 + 3
    q = [9 / 23, 8 / 23, 6 / 23]
    assert skew.federation_distribution() == pytest.approx(q)
    assert skew.kl("a") == pytest.approx(hand_kl([0.8, 0.2, 0.0], q))
    assert skew.kl("b") == pytest.approx(hand_kl([0.0, 0.5, 0.5], q))
    assert skew.kl("a") == pytest.approx(0.8 * math.log(0.8 * 23 / 9) + 0.2 * math.log(0.2 * 23 / 8))


def test_an_agent_at_the_federation_distribution_has_kl_near_zero() -> None:
    skew = LabelSkew()
    for agent in ("a", "b", "c"):
        observe(skew, agent, [1000, 1000, 1000, 1000])
    assert skew.kl("a") == pytest.approx(0.0, abs=1e-12)
    assert skew.weight_factor("a", 1.0) == pytest.approx(1.0)


def test_a_class_no_agent_holds_keeps_kl_finite() -> None:
    skew = LabelSkew(num_classes=4)
    observe(skew, "a", [5, 0, 0, 0])
    observe(skew, "b", [0, 5, 0, 0])
    q = skew.federation_distribution()
    assert q is not None and (q > 0).all() and q.sum() == pytest.approx(1.0)
    assert math.isfinite(skew.kl("a") or math.inf)


def test_agents_without_a_histogram_have_no_kl_and_full_weight() -> None:
    skew = LabelSkew()
    observe(skew, "dp", None, num_samples=50)
    assert skew.kl("dp") is None and skew.weight_factor("dp", 1.0) == 1.0
    assert skew.kl("unknown") is None and skew.weight_factor("unknown", 0.5) == 1.0
    observe(skew, "a", [3, 1])
    assert skew.kl("dp") is None and skew.weight_factor("dp", 1.0) == 1.0
    observe(skew, "empty", [0, 0])  # no samples: no distribution to compare
    assert skew.kl("empty") is None and skew.weight_factor("empty", 1.0) == 1.0


# -- weight factors ---------------------------------------------------------------------------
def test_weight_factor_is_exp_of_minus_kl_over_temperature() -> None:
    skew = LabelSkew(protection=0.0)  # the plain factor; test_rare_classes covers the rare-class floor
    observe(skew, "a", [90, 10])
    observe(skew, "b", [10, 90])
    observe(skew, "c", [50, 50])
    kl = skew.kl("a")
    assert kl is not None and kl > 0
    for temperature in (0.1, 1.0, 10.0):
        assert skew.weight_factor("a", temperature) == pytest.approx(math.exp(-kl / temperature))
    assert skew.weight_factor("a", 0.1) < skew.weight_factor("a", 1.0) < skew.weight_factor("a", 10.0) < 1.0
    # the balanced agent is closer to the federation than the skewed ones
    assert skew.weight_factor("c", 1.0) > skew.weight_factor("a", 1.0)
    assert skew.weight_factors(["a", "c", "x"], 1.0) == {
        "a": skew.weight_factor("a", 1.0), "c": skew.weight_factor("c", 1.0), "x": 1.0}
    protected = LabelSkew()
    for agent, counts in (("a", [90, 10]), ("b", [10, 90]), ("c", [50, 50])):
        observe(protected, agent, counts)
    for temperature in (0.1, 1.0, 10.0):  # the floor only ever lifts a factor, never past 1
        assert skew.weight_factor("a", temperature) <= protected.weight_factor("a", temperature) <= 1.0


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.inf, math.nan])
def test_temperature_must_be_positive_and_finite(temperature: float) -> None:
    skew = LabelSkew()
    observe(skew, "a", [1, 2])
    with pytest.raises(ValueError, match="temperature"):
        skew.weight_factor("a", temperature)


# -- running sum ------------------------------------------------------------------------------
def test_running_sum_equals_recomputation_after_replacements_and_forgets() -> None:
    rng = np.random.default_rng(3)
    skew = LabelSkew(num_classes=7)
    latest: dict[str, np.ndarray | None] = {}
    for step in range(600):
        agent = f"a{rng.integers(0, 25)}"
        action = rng.random()
        if action < 0.15:
            skew.forget(agent)
            latest.pop(agent, None)
        elif action < 0.25:
            skew.observe(agent, device="phone", num_samples=int(rng.integers(0, 50)), label_counts=None)
            latest[agent] = None
        else:
            counts = rng.integers(0, 40, size=7).astype(np.int64)
            skew.observe(agent, device="rpi", num_samples=int(counts.sum()), label_counts=counts)
            latest[agent] = counts
        if step % 50 == 0 or step == 599:
            expected = sum((c for c in latest.values() if c is not None), np.zeros(7, np.int64))
            np.testing.assert_array_equal(skew.federation_counts(), expected)
            q = (expected + 1.0) / (expected.sum() + 7.0)
            np.testing.assert_allclose(skew.federation_distribution(), q)
            for agent, counts in latest.items():
                if counts is not None and counts.sum():
                    assert skew.kl(agent) == pytest.approx(hand_kl(list(counts / counts.sum()), list(q)))
    assert len(skew) == len(latest)


def test_the_label_space_is_freed_when_every_histogram_is_forgotten() -> None:
    skew = LabelSkew()
    observe(skew, "a", [1, 2, 3])
    assert skew.num_classes == 3
    observe(skew, "a", [1, 2, 3, 4])  # the only histogram: its agent may change the label space
    assert skew.num_classes == 4
    skew.forget("a")
    assert skew.num_classes is None and skew.federation_distribution() is None
    observe(skew, "b", [1, 1])
    assert skew.num_classes == 2


def test_stored_histograms_are_copies() -> None:
    skew = LabelSkew()
    counts = np.array([4, 4], dtype=np.int64)
    skew.observe("a", device="rpi", num_samples=8, label_counts=counts)
    counts[0] = 1000  # the caller's array changing later does not corrupt the running sum
    np.testing.assert_array_equal(skew.federation_counts(), [4, 4])


# -- bad histograms ---------------------------------------------------------------------------
@pytest.mark.parametrize(("counts", "num_samples", "match"), [
    (np.array([1, 2, 3, 4], np.int64), 10, "4 classes, the federation's have 3"),
    (np.array([[1, 2, 3]], np.int64), 6, "1-D integer"),
    (np.array([1.0, 2.0, 3.0]), 6, "1-D integer"),
    (np.array([1, -2, 7], np.int64), 6, "negative"),
    (np.array([1, 2, 4], np.int64), 6, "sum to 7"),
    (np.array([MAX_AGENT_SAMPLES + 1, 0, 0], np.int64), MAX_AGENT_SAMPLES + 1, "exceed"),
    (np.array([2**62, 2**62, 0], np.int64), 2**63, "exceed"),
])
def test_bad_histograms_are_rejected_and_change_nothing(counts: np.ndarray, num_samples: int, match: str) -> None:
    skew = LabelSkew()
    observe(skew, "a", [1, 2, 3])
    observe(skew, "b", [3, 2, 1])
    before = skew.federation_counts()
    with pytest.raises(ValueError, match=match):
        skew.observe("b", device="rpi", num_samples=num_samples, label_counts=counts)
    np.testing.assert_array_equal(skew.federation_counts(), before)
    assert skew.kl("b") is not None  # its previous histogram stands


def test_a_fixed_label_space_rejects_other_lengths_even_for_the_first_histogram() -> None:
    skew = LabelSkew(num_classes=10)
    with pytest.raises(ValueError, match="3 classes, the federation's have 10"):
        observe(skew, "a", [1, 2, 3])
    assert len(skew) == 0


def test_observe_status_reads_the_message() -> None:
    status = AgentStatus(agent_id="a", state="online", device="jetson", family="f", num_samples=6,
                         num_eval_samples=1, version="t", timestamp=time.time(),
                         task_ref=TaskRef(name="digits", version="1"), layout="0" * 32,
                         label_counts=np.array([1, 2, 3], np.int64))
    skew = LabelSkew()
    skew.observe_status(status)
    np.testing.assert_array_equal(skew.federation_counts(), [1, 2, 3])
    assert skew.summary().labelled_by_device == {"jetson": 1}


# -- summary and gauges ---------------------------------------------------------------------------
def test_summary_by_hand() -> None:
    skew = LabelSkew()
    observe(skew, "a", [8, 2, 0], device="rpi")
    observe(skew, "b", [0, 5, 5], device="rpi")
    observe(skew, "c", [2, 2, 6], device="jetson")
    observe(skew, "dp", None, device="phone", num_samples=30)
    summary = skew.summary()
    q = [11 / 33, 10 / 33, 12 / 33]  # counts [10, 9, 11] + 1 over 30 + 3
    kls = {a: hand_kl(p, q) for a, p in (("a", [0.8, 0.2, 0.0]), ("b", [0.0, 0.5, 0.5]), ("c", [0.2, 0.2, 0.6]))}
    assert summary.agents == 4 and summary.labelled == 3
    assert summary.kl_by_device == pytest.approx({"rpi": (kls["a"] + kls["b"]) / 2, "jetson": kls["c"]})
    assert summary.labelled_by_device == {"rpi": 2, "jetson": 1}
    assert summary.kl_max == pytest.approx(max(kls.values()))
    proportions = np.array([[0.8, 0.2, 0.0], [0.0, 0.5, 0.5], [0.2, 0.2, 0.6]])
    assert summary.skew_index == pytest.approx(float(proportions.var(axis=0).mean()))
    samples = np.array([10, 10, 10, 30])
    assert summary.sample_count_cv == pytest.approx(float(samples.std() / samples.mean()))


def test_summary_of_identical_agents_has_no_skew() -> None:
    skew = LabelSkew()
    for agent in ("a", "b"):
        observe(skew, agent, [5, 5, 10])
    summary = skew.summary()
    assert summary.skew_index == pytest.approx(0.0, abs=1e-15) and summary.sample_count_cv == 0.0


def test_summary_chunks_agree_with_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    import coordinator.telemetry.heterogeneity as heterogeneity

    rng = np.random.default_rng(0)
    skew = LabelSkew()
    for i in range(40):
        counts = rng.integers(0, 20, size=5).astype(np.int64)
        skew.observe(f"a{i}", device=("rpi", "phone")[i % 2], num_samples=int(counts.sum()), label_counts=counts)
    whole = skew.summary()
    monkeypatch.setattr(heterogeneity, "_CHUNK_ELEMENTS", 15)  # 3 agents per chunk
    chunked = skew.summary()
    assert chunked.kl_by_device == pytest.approx(whole.kl_by_device)
    assert chunked.skew_index == pytest.approx(whole.skew_index)
    assert chunked.kl_max == pytest.approx(whole.kl_max)


def test_empty_summary() -> None:
    summary = LabelSkew().summary()
    assert summary.agents == 0 and summary.kl_by_device == {} and summary.skew_index is None
    assert summary.sample_count_cv is None and summary.kl_max is None


def test_gauges_read_from_a_fresh_registry() -> None:
    registry = CollectorRegistry()
    metrics = HeterogeneityMetrics(registry)
    skew = LabelSkew()
    observe(skew, "a", [8, 2, 0], device="rpi")
    observe(skew, "b", [0, 5, 5], device="rpi")
    observe(skew, "c", [2, 2, 6], device="jetson")
    summary = metrics.update(skew)
    value = registry.get_sample_value
    assert value("fl_label_kl_divergence", {"device": "rpi"}) == pytest.approx(summary.kl_by_device["rpi"])
    assert value("fl_label_kl_divergence", {"device": "jetson"}) == pytest.approx(summary.kl_by_device["jetson"])
    assert value("fl_label_skew_index") == pytest.approx(summary.skew_index)
    assert value("fl_sample_count_cv") == pytest.approx(summary.sample_count_cv)
    assert value("fl_weighting_factor_min") is None  # weighting off: not exported

    metrics.update(skew, temperature=2.0)
    worst = max(skew.kl(a) or 0.0 for a in "abc")
    assert value("fl_weighting_factor_min") >= math.exp(-worst / 2.0)  # the rare-class floor may lift it
    assert value("fl_weighting_factor_min") == pytest.approx(min(skew.weight_factor(a, 2.0) for a in "abc"))
    assert value("fl_weighting_class_ratio_min") == pytest.approx(skew.weighting_summary(2.0).class_ratio_min)

    skew.forget("c")  # jetson's last labelled agent left: its series goes
    metrics.update(skew, temperature=2.0)
    assert value("fl_label_kl_divergence", {"device": "jetson"}) is None
    assert value("fl_label_kl_divergence", {"device": "rpi"}) is not None


def test_device_labels_are_bounded() -> None:
    registry = CollectorRegistry()
    metrics = HeterogeneityMetrics(registry)
    skew = LabelSkew()
    for i in range(MAX_DEVICE_LABELS + 5):
        observe(skew, f"a{i}", [1 + i, 1], device=f"dev{i}")
    metrics.update(skew)
    devices = {s.labels["device"] for f in registry.collect() if f.name == "fl_label_kl_divergence"
               for s in f.samples}
    assert len(devices) == MAX_DEVICE_LABELS + 1 and "other" in devices
    # "other" is the mean over the agents folded into it
    summary = skew.summary()
    folded = [summary.kl_by_device[f"dev{i}"] for i in range(MAX_DEVICE_LABELS, MAX_DEVICE_LABELS + 5)]
    assert registry.get_sample_value("fl_label_kl_divergence", {"device": "other"}) == pytest.approx(
        sum(folded) / len(folded))


def test_a_shared_device_label_function_folds_device_classes() -> None:
    registry = CollectorRegistry()
    metrics = HeterogeneityMetrics(registry, device_label=lambda d: d if d in {"rpi", "jetson"} else "other")
    skew = LabelSkew()
    observe(skew, "a", [8, 2], device="rpi")
    observe(skew, "b", [2, 8], device="toaster")
    observe(skew, "c", [5, 5], device="fridge")
    metrics.update(skew)
    assert registry.get_sample_value("fl_label_kl_divergence", {"device": "other"}) == pytest.approx(
        ((skew.kl("b") or 0) + (skew.kl("c") or 0)) / 2)
