"""Compressed updates through the engine: decoded before any check, aggregated as plain arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from protocol.compression import CompressionSpec, pack_arrays
from protocol.messages import GlobalState, RoundAnnouncement
from protocol.wire import decode_message
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
