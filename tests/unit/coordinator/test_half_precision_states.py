"""Global states published in float16 (``--state-compression fp16``): half the bytes on the way out,
float32 master weights kept by the coordinator, so rounding never accumulates across rounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protocol.messages import GlobalState, RoundAnnouncement
from protocol.wire import decode_message
from tests.unit.coordinator.test_engine import TOPICS, Clock, hello, make_engine, rejected, send, update, weights

THIRD = np.float32(1 / 3)  # not a float16 number: its rounding shows


def payload(outbox, round_number: int) -> bytes:  # type: ignore[no-untyped-def]
    """Version ``round_number``'s state as published (later cleared from retention with an empty payload)."""
    topic = TOPICS.global_state("f", round_number)
    return [p for t, p, _ in outbox.sent if t == topic and p][-1]


def published(outbox, round_number: int) -> GlobalState:  # type: ignore[no-untyped-def]
    return decode_message(payload(outbox, round_number), GlobalState)  # validates the digest


def run_two_rounds(tmp_path: Path, state_compression: str):  # type: ignore[no-untyped-def]
    engine, outbox, metrics = make_engine(tmp_path, Clock(), state_compression=state_compression)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    for agent in ("a", "b"):
        send(engine, update(engine, agent, 1, weights=weights(float(THIRD))))
    engine.tick(), engine.tick()
    v2 = published(outbox, 2)
    for agent in ("a", "b"):  # deltas from the weights the agents received, naming their digest
        send(engine, update(engine, agent, 2, delta=weights(float(THIRD))))
    engine.tick(), engine.tick()
    return engine, outbox, metrics, v2


def test_states_go_out_in_half_precision_and_deltas_land_on_float32_masters(tmp_path: Path) -> None:
    engine, outbox, metrics, v2 = run_two_rounds(tmp_path / "half", "fp16")
    assert {a.dtype for a in v2.weights.values()} == {np.dtype(np.float16)}
    np.testing.assert_array_equal(v2.weights["w"], np.float16(THIRD))
    announced = decode_message(outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    assert announced.states["f"].digest == published(outbox, 3).digest  # the digest of what goes out
    assert rejected(metrics, "stale_base") == 0  # round 2's updates named the half-precision digest: admitted
    master = engine.strategy.states["f"].weights["w"]
    assert master.dtype == np.float32
    np.testing.assert_array_equal(master, THIRD + THIRD)  # float32 arithmetic, no float16 rounding kept
    np.testing.assert_array_equal(published(outbox, 3).weights["w"], np.float16(THIRD + THIRD))

    _, full_outbox, _, full_v2 = run_two_rounds(tmp_path / "full", "none")
    assert full_v2.weights["w"].dtype == np.float32
    half_bytes, full_bytes = len(payload(outbox, 2)), len(payload(full_outbox, 2))
    raw = metrics.registry.get_sample_value("fl_global_state_raw_bytes_total")
    sent = metrics.registry.get_sample_value("fl_sent_bytes_total", {"kind": "global_state"})
    assert raw == 2 * 9 * 4  # versions 2 and 3, nine float32 entries each, at the coordinator's precision
    assert sent == len(payload(outbox, 2)) + len(payload(outbox, 3))  # (clearing version 2 sent 0 bytes)
    assert half_bytes <= full_bytes - 2 * 9  # 9 entries, 2 bytes fewer each (shorter framing may save more)


def test_a_restarted_coordinator_publishes_the_same_half_precision_state(tmp_path: Path) -> None:
    engine, outbox, _, _ = run_two_rounds(tmp_path, "fp16")
    digest = engine.strategy.states["f"].digest
    restarted, _, _ = make_engine(tmp_path, Clock(), state_compression="fp16")
    assert restarted.strategy.states["f"].digest == digest == published(outbox, 3).digest
