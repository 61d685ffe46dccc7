"""KL weighting against lying label counts (found in review): a status histogram counts for no more samples than the
agent's updates may, so one device cannot own the federation's label distribution, strip a rare class's floor
from its real holder, or hide the collapse from the class-ratio gauge; the rare-class top-ups are one snapshot a
round; a regression task keeps no histograms; a temperature too small for any weight is refused at start-up.
Engines driven directly (test_engine.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from protocol.messages import AgentStatus, GlobalState
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, make_engine, send, update, weights

UNIFORM = np.full(10, 10, np.int64)  # an honest, IID agent: 100 samples, 10 per digit


def hello_labels(engine, agent_id: str, counts: np.ndarray, num_samples: int | None = None, seq: int = 1) -> None:
    counts = np.asarray(counts, np.int64)
    status = AgentStatus(agent_id=agent_id, state="online", device="rpi", family="f",
                         num_samples=int(counts.sum()) if num_samples is None else num_samples,
                         num_eval_samples=2, version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT,
                         label_counts=counts, epoch=1, seq=seq)
    engine.on_message(TOPICS.agent_status(agent_id), encode_message(status))


def liar_share_after_round_2(tmp_path: Path, liar_counts: np.ndarray) -> float:
    """Honest a, b (IID, 100 samples) and liar L; every update claims 100 samples. Round 2: a and b send
    delta 0, L sends delta 1, so the new global w - 1 is L's share of the aggregate weight."""
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock, weighting="kl", min_available_agents=3, min_fit_agents=3,
                                    max_norm_ratio=0)
    hello_labels(engine, "a", UNIFORM)
    hello_labels(engine, "b", UNIFORM)
    hello_labels(engine, "L", liar_counts)
    engine.tick()
    for agent in ("a", "b", "L"):
        send(engine, update(engine, agent, 1, samples=100, weights=weights(1.0)))
    engine.tick(), engine.tick()
    assert engine.open is not None and engine.open.number == 2
    for agent in ("a", "b"):
        send(engine, update(engine, agent, 2, samples=100, delta=weights(0.0)))
    send(engine, update(engine, "L", 2, samples=100, delta=weights(1.0)))
    engine.tick(), engine.tick()
    state = decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState)
    return float(state.weights["w"][0, 0]) - 1.0


def test_control_an_honest_third_agent_gets_a_third(tmp_path: Path) -> None:
    assert abs(liar_share_after_round_2(tmp_path, UNIFORM) - 1 / 3) < 1e-3


def test_a_status_histogram_larger_than_the_claim_cap_shifts_the_pool_and_shrinks_honest_agents(tmp_path: Path) -> None:
    """The liar's updates claim 100 samples like everyone's, its *status* ~10^9, 90% digit 0. Uncapped, that
    histogram dominated q: the honest IID agents sat at KL ~1.8 (factor ~0.16), the liar at ~0 (factor 1), and it
    took 0.759 of the round where sample weighting gives it 1/3. Capped to its sample cap, it takes no more."""
    big = np.full(10, 10**7, np.int64)
    big[0] = 9 * 10**8
    share = liar_share_after_round_2(tmp_path, big)
    assert share <= 1 / 3 + 1e-3, f"liar got {share:.3f} of the aggregate (sample weighting: 0.333)"


NINE = np.r_[np.full(9, 11), [0]].astype(np.int64)
NINE[0] += 1  # an honest agent of digits 0-8 (100 samples), none of digit 9
NINES = np.r_[np.zeros(9), [100]].astype(np.int64)  # the honest sole holder of digit 9 (100 samples)


def rare_holder_round(tmp_path: Path, liar_counts: np.ndarray):
    """h0-h2 hold digits 0-8, ``a`` alone holds digit 9, L is the fifth agent. Every update claims 100 samples.
    Round 2: ``a`` sends delta 1, the rest 0: the new w - 1 is a's share (sample weighting: 1/5)."""
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock, weighting="kl", min_available_agents=5, min_fit_agents=5,
                                          max_norm_ratio=0)
    agents = {"h0": NINE, "h1": NINE, "h2": NINE, "a": NINES, "L": liar_counts}
    for agent, counts in agents.items():
        hello_labels(engine, agent, counts)
    engine.tick()
    for agent in agents:
        send(engine, update(engine, agent, 1, samples=100, weights=weights(1.0)))
    engine.tick(), engine.tick()
    assert engine.open is not None and engine.open.number == 2
    for agent in agents:
        send(engine, update(engine, agent, 2, samples=100, delta=weights(1.0 if agent == "a" else 0.0)))
    engine.tick(), engine.tick()
    state = decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState)
    ratio_gauge = metrics.registry.get_sample_value("fl_weighting_class_ratio_min")
    return float(state.weights["w"][0, 0]) - 1.0, ratio_gauge


def test_control_the_sole_holder_of_a_rare_class_keeps_its_sample_share(tmp_path: Path) -> None:
    share, _ = rare_holder_round(tmp_path, np.full(10, 10, np.int64))  # L honest and IID
    assert share >= 0.2 * 0.95


def test_an_oversized_status_histogram_strips_the_rare_class_floor_from_its_real_holder(tmp_path: Path) -> None:
    """L's status claims 10^8 samples per digit (its updates 100): uncapped it 'held' ~100% of digit 9, class 9
    did not count as starved, and ``a``, its only real holder, fell from 0.2 of the round to 0.026."""
    share, _ = rare_holder_round(tmp_path, np.full(10, 10**8, np.int64))
    assert share >= 0.2 * 0.95, f"the sole real holder of digit 9 got {share:.3f} of the round (sample weighting 0.2)"


def test_the_class_ratio_gauge_hides_the_collapse_of_digit_9(tmp_path: Path) -> None:
    """Same round: the gauge, computed from the (capped) histograms, is no higher than digit 9's real weight ratio
    (a's share over its sample share); uncapped it read 1.0 while digit 9's was 0.13."""
    share, gauge = rare_holder_round(tmp_path, np.full(10, 10**8, np.int64))
    real_ratio = share / 0.2
    assert gauge is not None
    assert gauge <= real_ratio + 0.1, f"gauge {gauge:.3f}, digit 9's real ratio {real_ratio:.3f}"


def test_each_status_change_forces_a_full_rare_class_recompute_at_the_next_update(tmp_path: Path, monkeypatch) -> None:
    """``rare_classes.protect`` (up to 41 passes over every known histogram: ~1 s at 50,000 agents) was recomputed
    after every change of counts, so a liar changing its histogram before each honest update made every update
    recompute it. Now it is one snapshot a round."""
    import coordinator.telemetry.heterogeneity as heterogeneity

    calls = []
    real_protect = heterogeneity.protect

    def counting(*args, **kwargs):
        calls.append(1)
        return real_protect(*args, **kwargs)

    monkeypatch.setattr(heterogeneity, "protect", counting)  # instrumentation only: the real function runs
    clock = Clock()
    honest = [f"h{i}" for i in range(10)]
    engine, _, _ = make_engine(tmp_path, clock, weighting="kl", min_available_agents=11, min_fit_agents=11,
                               max_norm_ratio=0)
    for i, agent in enumerate(honest):
        counts = np.zeros(10, np.int64)
        counts[i % 10], counts[(i + 1) % 10] = 60, 40
        hello_labels(engine, agent, counts)
    hello_labels(engine, "L", UNIFORM)
    engine.tick()
    assert engine.open is not None
    calls.clear()
    for k, agent in enumerate(honest):
        flip = UNIFORM.copy()
        flip[0] += 1 + k % 2  # a different histogram each time (sum adjusted to match)
        hello_labels(engine, "L", flip, seq=2 + k)
        send(engine, update(engine, agent, 1, samples=100, weights=weights(1.0)))
    assert len(engine.open.updates) == 10
    assert len(calls) <= 2, f"{len(calls)} full protection recomputes for one round's 10 updates"


def test_a_regression_task_keeps_arbitrary_label_histograms(tmp_path: Path) -> None:
    """A regression card declares no classes: the first histogram used to fix a label space of up to 1,024 classes
    and every agent could park an 8 KB histogram, meaning nothing for regression. Now they are dropped."""
    import json

    from protocol.messages import TaskRef

    card = tmp_path / "line.json"
    card.write_text(json.dumps({"name": "line", "version": "1", "kind": "regression", "families": ["f"]}))
    engine, _, _ = make_engine(tmp_path, Clock(), task=str(card), weighting="kl")
    counts = np.zeros(1024, np.int64)
    counts[0] = 5
    status = AgentStatus(agent_id="x", state="online", device="rpi", family="f", num_samples=5, num_eval_samples=2,
                         version="t", timestamp=0.0, task_ref=TaskRef(name="line", version="1"), layout=LAYOUT,
                         label_counts=counts, epoch=1, seq=1)
    engine.on_message(TOPICS.agent_status("x"), encode_message(status))
    assert engine.parts.registry.get("x") is not None  # the status was taken
    labels = engine.parts.labels
    assert labels.num_classes is None, f"kept a {labels.num_classes}-class histogram for a regression task"


def test_a_temperature_under_which_every_weight_could_underflow_is_refused_at_start_up() -> None:
    """At 0.001 three honest one-class agents got exp(-1100) = 0: every weight 0, every round failed."""
    with pytest.raises(ValidationError, match="kl_temperature"):
        CoordinatorSettings(weighting="kl", kl_temperature=0.001)


def test_one_class_agents_keep_a_weight_at_the_smallest_temperature(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, weighting="kl", kl_temperature=0.1, min_available_agents=3,
                               min_fit_agents=3, max_norm_ratio=0)
    for i, agent in enumerate("abc"):
        counts = np.zeros(10, np.int64)
        counts[i] = 100
        hello_labels(engine, agent, counts)
    engine.tick()
    for agent in "abc":
        send(engine, update(engine, agent, 1, samples=100, weights=weights(1.0)))
    engine.tick(), engine.tick()
    assert engine.open is not None and engine.open.number == 2
    for agent in "abc":
        send(engine, update(engine, agent, 2, samples=100, delta=weights(1.0)))
    engine.tick()
    assert (engine.last_summary.round, engine.last_summary.outcome) == (2, "completed")
