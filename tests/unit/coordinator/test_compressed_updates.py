"""Compressed updates through the engine: decoded before any check, aggregated as plain arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from protocol.compression import CompressionSpec, pack_arrays
from protocol.messages import GlobalState, RoundAnnouncement
from protocol.wire import decode_message, encode_message
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, rejected, send, update, weights


def to_round_two(tmp_path: Path, compression: str):  # type: ignore[no-untyped-def]
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock, compression=compression, momentum=0.0)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1, weights=weights(1.0)))
    send(engine, update(engine, "b", 1, weights=weights(1.0)))
    engine.tick(), engine.tick()
    announced = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement).compression
    assert announced == str(CompressionSpec.parse(compression))
    return engine, outbox, metrics


def test_top_k_needs_plain_local_sgd() -> None:
    with pytest.raises(ValidationError, match="compression topk:0.01 needs momentum 0"):
        CoordinatorSettings(compression="topk:0.01")
    assert CoordinatorSettings(compression="topk:0.01", momentum=0.0).compression == "topk:0.01"


def packed(engine, agent: str, value: float, compression: str):  # type: ignore[no-untyped-def]
    plain = update(engine, agent, 2, delta=weights(value))
    return plain.model_copy(update={"delta": {}, "packed_delta": pack_arrays(plain.delta, compression,
                                                                             np.random.default_rng(0))})


@pytest.mark.parametrize("compression", ["fp16", "int8", "topk:1"])
def test_packed_deltas_aggregate_like_plain_ones(tmp_path: Path, compression: str) -> None:
    engine, outbox, metrics = to_round_two(tmp_path, compression)
    send(engine, packed(engine, "a", 0.5, compression))
    send(engine, packed(engine, "b", 0.5, compression))
    engine.tick(), engine.tick()
    state = decode_message(outbox.last(TOPICS.global_state("f", 3)), GlobalState)
    np.testing.assert_allclose(state.weights["w"], 1.5, atol=0.5 / 127 if compression == "int8" else 1e-3)
    wire = metrics.registry.get_sample_value("fl_update_wire_bytes_total")
    raw = metrics.registry.get_sample_value("fl_update_raw_bytes_total")
    assert raw == 4 * 9 * 4 and wire > 0  # rounds 1 and 2, two updates each, 9 float32 each: counted raw


def test_packed_deltas_of_another_kind_or_layout_are_rejected(tmp_path: Path) -> None:
    engine, _, metrics = to_round_two(tmp_path, "int8")
    send(engine, packed(engine, "a", 0.5, "fp16"))
    assert rejected(metrics, "compression_mismatch") == 1
    wrong = update(engine, "a", 2, delta={"w": np.zeros((3, 3), np.float32), "b": np.zeros(3, np.float32)})
    send(engine, wrong.model_copy(update={"delta": {}, "packed_delta": pack_arrays(wrong.delta, "int8")}))
    assert rejected(metrics, "bad_shape") == 1
    send(engine, packed(engine, "a", 0.5, "int8"))  # the right one still gets in
    assert "a" in engine.open.updates


def test_a_plain_delta_in_a_compressed_run_is_admitted_and_counted_with_or_without_a_reason(tmp_path: Path) -> None:
    engine, _, metrics = to_round_two(tmp_path, "int8")
    declined = update(engine, "a", 2, delta=weights(0.5)).model_copy(
        update={"compression_declined": "this agent does not use int8 (its compressors: fp16)"})
    send(engine, declined)
    send(engine, update(engine, "b", 2, delta=weights(0.5)))  # an older agent: no reason given
    assert set(engine.open.updates) == {"a", "b"}

    def counted(why: str) -> float | None:
        return metrics.registry.get_sample_value("fl_updates_uncompressed_total", {"why": why})

    assert counted("declined") == 1 and counted("unexplained") == 1


def test_compression_declined_travels_only_with_a_plain_delta(tmp_path: Path) -> None:
    engine, _, _ = to_round_two(tmp_path, "int8")
    compressed = packed(engine, "a", 0.5, "int8")
    with pytest.raises(ValidationError, match="compression_declined travels with an uncompressed delta"):
        type(compressed).model_validate({**compressed.model_dump(), "compression_declined": "x"})


# -- found in review: a norm that overflows, a gauge one device set, sites in a compressing run ------------------
def f8_weights(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value, np.float64), "b": np.full(3, value, np.float64)}


@pytest.mark.parametrize("how", ["int8", "plain"])
def test_a_delta_whose_norm_overflows_is_refused_and_the_round_completes(tmp_path: Path, how: str) -> None:
    """A float64 model: int8 values of 127 at the largest scale the codec allows decode to finite values whose L2
    norm overflows float64; the clip skipped such a norm and the sum overflowed, failing the round for the four
    honest agents. The same values sent plain did too. Now the update is refused (``non_finite``)."""
    from tests.task_refs import layout

    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, compression="int8", momentum=0.0, min_available_agents=3,
                                     min_fit_agents=3)
    agents = ["a", "b", "c", "d", "e"]
    for agent in agents:
        hello(engine, agent, model=layout(f8_weights(0.0)))
    engine.tick()
    for agent in agents:
        send(engine, update(engine, agent, 1, weights=f8_weights(1.0)))
    engine.tick(), engine.tick()
    assert engine.open is not None and engine.open.number == 2
    for agent in ("a", "b", "c", "d"):
        plain = update(engine, agent, 2, delta=f8_weights(0.01))
        send(engine, plain.model_copy(update={"delta": {}, "packed_delta": pack_arrays(plain.delta, "int8")}))
    scale = float(np.finfo(np.float64).max) / 127 * (1 - 1e-15)
    liar = update(engine, "e", 2, delta={n: np.full(a.shape, 127 * scale, np.float64)
                                         for n, a in f8_weights(0).items()})
    if how == "int8":
        packed_arrays = pack_arrays(liar.delta, "int8")
        assert all(float(p.scale) == pytest.approx(scale) for p in packed_arrays.values())  # type: ignore[attr-defined]
        liar = liar.model_copy(update={"delta": {}, "packed_delta": packed_arrays})
    send(engine, liar)
    assert rejected(metrics, "non_finite") == 1
    clock.now += 11
    engine.tick(), engine.tick()
    summary = engine.last_summary
    assert (summary.round, summary.outcome, summary.answered) == (2, "completed", 4)
    np.testing.assert_allclose(engine.strategy.states["f"].weights["w"], 1.01)


def test_the_residual_gauge_takes_only_a_norm_and_only_in_a_run_that_compresses(tmp_path: Path) -> None:
    from protocol.messages import TrainMetrics

    def reporting(engine, agent: str, value: float, **payload: object):  # type: ignore[no-untyped-def]
        return update(engine, agent, engine.open.number, **payload).model_copy(
            update={"metrics": TrainMetrics(extra={"ef_residual_norm": value})})

    plain_run, _, metrics = make_engine(tmp_path / "plain", Clock())
    hello(plain_run, "a"), hello(plain_run, "b")
    plain_run.tick()
    send(plain_run, reporting(plain_run, "a", 7.0, weights=weights(1.0)))
    assert "a" in plain_run.open.updates and metrics.registry.get_sample_value("fl_error_feedback_residual_norm") == 0
    engine, _, metrics = to_round_two(tmp_path / "topk", "topk:0.5")
    send(engine, reporting(engine, "a", -1e300, delta={}, packed_delta=pack_arrays(weights(0.5), "topk:0.5")))
    assert "a" in engine.open.updates and metrics.registry.get_sample_value("fl_error_feedback_residual_norm") == 0
    send(engine, reporting(engine, "b", 0.25, delta={}, packed_delta=pack_arrays(weights(0.5), "topk:0.5")))
    assert metrics.registry.get_sample_value("fl_error_feedback_residual_norm") == 0.25


def test_a_site_refuses_compressed_deltas_saying_why_and_the_root_counts_them_rejected(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A site holds no global state to unpack against: its agents' int8 deltas are refused as ``site_unsupported``
    (before: ``compression_mismatch``, "the run compresses with none", and the agents counted as late), it warns
    once a round, and an agent that sends plain still counts."""
    from tests.unit.coordinator.test_sites import SITES, plain_answer, run_rounds, setup, tick_site

    root, outbox, metrics, sites = setup(tmp_path, "sites", with_sites=True, compression="int8", momentum=0.0)
    run_rounds(root, outbox, sites, 1)  # the bootstrap: weights travel plain
    root.tick()
    payload = outbox.last(TOPICS.rounds_current)
    announcement = decode_message(payload, RoundAnnouncement)
    site = sites["s3"]
    site.on_message(TOPICS.rounds_current, payload)
    assert "does not unpack" in caplog.text
    for agent_id in SITES["s3"]:
        message = plain_answer(announcement, agent_id, root.run.run_id)
        if agent_id != "c4":  # c4 cannot compress and sends plain
            message = message.model_copy(update={"delta": {}, "packed_delta": pack_arrays(message.delta, "int8")})
        site.on_message(TOPICS.update(agent_id, 2), encode_message(message))
    (topic, sealed), = tick_site(site)[1]
    from protocol.partials import PartialAggregate

    partial = decode_message(sealed, PartialAggregate)
    assert {a: (o.outcome, o.reason) for a, o in partial.outcomes.items()} == {
        "c1": ("rejected", "site_unsupported"), "c2": ("rejected", "site_unsupported"),
        "c3": ("rejected", "site_unsupported"), "c4": ("accepted", None)}
    root.on_message(topic, sealed)
    assert rejected(metrics, "site_unsupported") == 3
