"""An agent compresses its delta as the round asks; top-k keeps its residual in the state directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.compression import DeltaCompressor
from edge_agent.data.local import build_local_data
from edge_agent.state import AgentStateDir
from edge_agent.tasks import resolve_task
from edge_agent.worker import LocalWorker
from protocol.compression import unpack_arrays
from protocol.messages import GlobalState, LocalTraining, RoundAnnouncement, StateRef
from protocol.wire import decode_message, encode_message

DIGITS = resolve_task("digits")


def announce(round_number: int, state: GlobalState, compression: str, layout: str) -> RoundAnnouncement:
    import time

    return RoundAnnouncement(
        run_id="r", round=round_number, task="train", task_ref=DIGITS.card.ref, layouts={"mlp_tiny": layout},
        algorithm="fedavg", training=LocalTraining(epochs=1, learning_rate=0.05), selected=["a"],
        states={"mlp_tiny": StateRef(family="mlp_tiny", round=state.round, digest=state.digest)}, init_seed=0,
        issued_at=time.time(), deadline_s=60.0, last_round=5, compression=compression)


def start_state(round_number: int = 2) -> GlobalState:
    from edge_agent.weights import get_arrays

    weights = get_arrays(DIGITS.build_model("mlp_tiny", 0))
    return GlobalState(run_id="r", family="mlp_tiny", round=round_number, weights=weights,
                       digest=GlobalState.compute_digest(weights, {}, None, None))


@pytest.mark.parametrize("compression", ["fp16", "int8", "topk:0.05"])
def test_the_update_carries_a_packed_delta_that_decodes_close_to_the_plain_one(tmp_path: Path,
                                                                                compression: str) -> None:
    data = build_local_data(DIGITS, partition="iid", num_partitions=4)
    worker = LocalWorker("a", DIGITS, "mlp_tiny", data, torch.device("cpu"), 32, AgentStateDir(tmp_path / "a"))
    plain = worker.answer(announce(2, start_state(), "none", worker.layout), start_state())
    worker2 = LocalWorker("a", DIGITS, "mlp_tiny", data, torch.device("cpu"), 32, AgentStateDir(tmp_path / "b"))
    update = worker2.answer(announce(2, start_state(), compression, worker.layout), start_state())
    assert not update.delta and set(update.packed_delta) == set(plain.delta)
    decoded = decode_message(encode_message(update), type(update))  # survives the wire
    restored = unpack_arrays(decoded.packed_delta)
    if compression == "topk:0.05":  # model-wide: 5% of all the delta's entries, wherever they are
        total = sum(a.size for a in plain.delta.values())
        assert sum(np.count_nonzero(a) for a in restored.values()) <= int(np.ceil(0.05 * total))
    for name, array in plain.delta.items():
        if compression != "topk:0.05":
            scale = np.abs(array).max() / 127 if compression == "int8" else np.abs(array).max() * 1e-3 + 1e-6
            np.testing.assert_allclose(restored[name], array, atol=scale * 1.001)
    assert ("ef_residual_norm" in update.metrics.extra) == compression.startswith("topk")


def test_top_k_residuals_survive_a_restart_and_belong_to_one_run(tmp_path: Path) -> None:
    state = AgentStateDir(tmp_path)
    delta = {"w": np.linspace(-1, 1, 100, dtype=np.float32).reshape(10, 10)}
    first = DeltaCompressor(state, "a", "run1", "fam", 1)
    sent = first.compress({"delta": delta}, "topk:0.1")
    first.commit()
    residual = state.read_arrays("ef-run1-fam")
    assert residual is not None and np.count_nonzero(residual["w"]) == 90  # what was not sent
    again = DeltaCompressor(state, "a", "run1", "fam", 2)  # a reboot: a new compressor reads it back
    second = again.compress({"delta": {"w": np.zeros((10, 10), np.float32)}}, "topk:0.1")
    assert np.abs(unpack_arrays(second["packed_delta"])["w"]).sum() > 0  # the residual is being sent now
    assert sent["delta"] == {}
    DeltaCompressor(state, "a", "run2", "fam", 1).compress({"delta": delta}, "topk:0.1")
    other = DeltaCompressor(state, "a", "run2", "fam", 1)
    other.compress({"delta": delta}, "topk:0.1")
    other.commit()
    assert state.read_arrays("ef-run1-fam") is None  # an earlier run's residual is dropped


def test_a_half_precision_global_state_trains_exactly_like_its_float32_widening(tmp_path: Path) -> None:
    """``--state-compression fp16``: the agent widens float16 weights losslessly, names the digest of
    what it received, and sends a float32 delta from those weights."""
    from protocol.compression import half_precision

    full = start_state()
    halves = half_precision(full.weights)
    half = GlobalState(run_id="r", family="mlp_tiny", round=2, weights=halves,
                       digest=GlobalState.compute_digest(halves, {}, None, None))
    widened_weights = {n: a.astype(np.float32) for n, a in halves.items()}
    widened = GlobalState(run_id="r", family="mlp_tiny", round=2, weights=widened_weights,
                          digest=GlobalState.compute_digest(widened_weights, {}, None, None))
    data = build_local_data(DIGITS, partition="iid", num_partitions=4)
    answers = []
    for name, state in (("half", half), ("widened", widened)):
        worker = LocalWorker("a", DIGITS, "mlp_tiny", data, torch.device("cpu"), 32, AgentStateDir(tmp_path / name))
        answers.append(worker.answer(announce(2, state, "none", worker.layout), state))
    from_half, from_widened = answers
    assert from_half.base_digest == half.digest != widened.digest == from_widened.base_digest
    assert {a.dtype for a in from_half.delta.values()} == {np.dtype(np.float32)}
    for name, delta in from_widened.delta.items():
        np.testing.assert_array_equal(from_half.delta[name], delta)


def test_an_agent_that_does_not_use_the_rounds_compressor_says_so_and_sends_plain(tmp_path: Path) -> None:
    data = build_local_data(DIGITS, partition="iid", num_partitions=4)
    worker = LocalWorker("a", DIGITS, "mlp_tiny", data, torch.device("cpu"), 32, AgentStateDir(tmp_path),
                         compressors=frozenset({"fp16"}))
    update = worker.answer(announce(2, start_state(), "topk:0.05", worker.layout), start_state())
    assert update.delta and not update.packed_delta
    assert update.compression_declined == "this agent does not use topk (its compressors: fp16)"
    assert decode_message(encode_message(update), type(update)).compression_declined == update.compression_declined
    halves = worker.answer(announce(3, start_state(3), "fp16", worker.layout), start_state(3))
    assert halves.packed_delta and halves.compression_declined is None


def test_the_compressors_setting_names_itself_when_wrong() -> None:
    from pydantic import ValidationError

    from edge_agent.config import AgentSettings

    assert AgentSettings(compressors="topk, fp16,topk").compressor_kinds() == {"fp16", "topk"}
    assert AgentSettings(compressors="none").compressor_kinds() == frozenset()
    with pytest.raises(ValidationError, match="compressors: zstd is not one of fp16, int8, topk"):
        AgentSettings(compressors="fp16,zstd")
