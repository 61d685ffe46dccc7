"""SCAFFOLD on the agent: the variate it keeps, where it keeps it, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.algorithms import RoundContext
from edge_agent.algorithms.base import parameter_names
from edge_agent.algorithms.scaffold import ScaffoldClient, revert_control
from edge_agent.models import build_model
from edge_agent.state import AgentStateDir
from protocol.errors import ProtocolError
from protocol.messages import LocalTraining
from tests.unit.edge_agent.rounds import RUN, announce, digits_subset, global_state, global_weights, make_worker

FAMILY = "cnn_small"


def control_of(state_dir: Path, run_id: str = RUN) -> dict[str, np.ndarray]:
    stored = AgentStateDir(state_dir).read_arrays(f"scaffold-{run_id}-{FAMILY}")
    assert stored is not None
    return {k.removeprefix("after/"): v for k, v in stored.items() if k.startswith("after/")}


def test_an_update_carries_a_delta_and_a_control_delta_over_the_parameters_only(tmp_path: Path) -> None:
    data = digits_subset()
    weights = global_weights(FAMILY)
    names = parameter_names(build_model(FAMILY, data.train.in_shape, 10, seed=0))
    control = {n: np.full_like(weights[n], 0.01) for n in names}
    state = global_state(FAMILY, 2, weights=weights, control=control)
    update = make_worker(tmp_path, data).answer(announce("scaffold", 2, state, momentum=0.0), state)
    assert update.delta.keys() == weights.keys()
    assert sorted(update.control_delta) == sorted(names)
    # c_i+ = c_i - c + (x - y) / (K lr), with c_i = 0 in the first round: so dc = -c - delta / (K lr).
    steps, lr = update.metrics.steps, 0.05
    for name in names:
        expected = -control[name].astype(np.float64) - update.delta[name] / (steps * lr)
        np.testing.assert_allclose(update.control_delta[name], expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(control_of(tmp_path)[names[0]], update.control_delta[names[0]], rtol=1e-6)


def test_a_round_that_leaves_the_head_uncorrected_moves_only_the_features_by_lr_times_c_minus_c_i(
        tmp_path: Path) -> None:
    """``correct_head`` false: after each step the feature layers move by -lr (c - c_i), the head not at all
    (plain SGD steps there); by default every parameter does."""
    data = digits_subset()
    model = build_model(FAMILY, data.train.in_shape, 10, seed=0)
    names = parameter_names(model)
    weights = global_weights(FAMILY)
    state = global_state(FAMILY, 2, weights=weights, control={n: np.full_like(weights[n], 0.05) for n in names})
    for params, head_corrected in (({"correct_head": False}, False), ({}, True)):
        client = ScaffoldClient(params, AgentStateDir(tmp_path / str(head_corrected)),
                                RoundContext(RUN, 2, FAMILY, torch.device("cpu")))
        client.check_plan(LocalTraining(epochs=1, learning_rate=0.1, momentum=0.9))
        client.begin(model, state)
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        client.after_step(model)
        for name, p in model.named_parameters():
            moved = 0.1 * 0.05 if head_corrected or not name.startswith("head.") else 0.0  # c_i is 0 in a first round
            assert torch.allclose(before[name] - p.detach(), torch.full_like(p, moved)), (params, name)
    with pytest.raises(ProtocolError, match="correct_head"):
        ScaffoldClient({"correct_head": "maybe"}, AgentStateDir(tmp_path / "x"),
                       RoundContext(RUN, 3, FAMILY, torch.device("cpu")))


def test_the_variate_survives_a_restart_and_a_new_run_starts_from_zero(tmp_path: Path) -> None:
    data = digits_subset()
    first = make_worker(tmp_path, data).answer(announce("scaffold", 1, momentum=0.0), None)
    assert first.weights and first.control_delta  # bootstrap: weights, and the variate's change
    saved = control_of(tmp_path)

    # A "rebooted" agent (new worker, same directory) starts round 2 from the saved variate.
    state = global_state(FAMILY, 2, weights=first.weights,
                         control={n: np.zeros_like(a) for n, a in first.control_delta.items()})
    make_worker(tmp_path, data).answer(announce("scaffold", 2, state, momentum=0.0), state)
    stored = AgentStateDir(tmp_path).read_arrays(f"scaffold-{RUN}-{FAMILY}")
    assert stored is not None and int(stored["round"]) == 2
    for name, value in saved.items():
        np.testing.assert_array_equal(stored[f"before/{name}"], value)

    # Answering round 2 again (the device died before its update was recorded) starts from the
    # same variate, not from the one it already advanced to.
    again = make_worker(tmp_path, data).answer(announce("scaffold", 2, state, momentum=0.0), state)
    stored_again = AgentStateDir(tmp_path).read_arrays(f"scaffold-{RUN}-{FAMILY}")
    assert stored_again is not None
    for name in saved:
        np.testing.assert_array_equal(stored_again[f"before/{name}"], saved[name])
        np.testing.assert_array_equal(stored_again[f"after/{name}"], stored[f"after/{name}"])
    assert again.control_delta.keys() == saved.keys()

    # Another run: the old variate is removed and the new one starts from zero.
    make_worker(tmp_path, data).answer(announce("scaffold", 1, momentum=0.0, run_id="run-2"), None)
    assert AgentStateDir(tmp_path).names("scaffold-") == [f"scaffold-run-2-{FAMILY}"]
    fresh = AgentStateDir(tmp_path).read_arrays(f"scaffold-run-2-{FAMILY}")
    assert fresh is not None and all(not fresh[f"before/{n}"].any() for n in saved)


def test_a_server_variate_that_does_not_fit_the_model_is_refused(tmp_path: Path) -> None:
    data = digits_subset(per_class=2)
    weights = global_weights(FAMILY)
    state = global_state(FAMILY, 2, weights=weights, control={"head.bias": np.zeros(3, np.float32)})
    with pytest.raises(ProtocolError, match="server control variate"):
        make_worker(tmp_path, data).answer(announce("scaffold", 2, state, momentum=0.0), state)


def test_a_corrupt_variate_file_restarts_from_zero(tmp_path: Path) -> None:
    state_dir = AgentStateDir(tmp_path)
    (tmp_path / f"scaffold-{RUN}-{FAMILY}.msgpack").write_bytes(b"\xc1garbage")
    client = ScaffoldClient({}, state_dir, RoundContext(RUN, 3, FAMILY, torch.device("cpu")))
    params = {"w": np.ones(2, np.float32)}
    assert not client.load_control(params)["w"].any()


def test_a_compressed_round_packs_the_control_delta_with_its_own_residual(tmp_path: Path) -> None:
    from protocol.compression import unpack_arrays
    from protocol.messages import Update
    from protocol.wire import decode_message, encode_message

    data = digits_subset()
    weights = global_weights(FAMILY)
    names = parameter_names(build_model(FAMILY, data.train.in_shape, 10, seed=0))
    state = global_state(FAMILY, 2, weights=weights, control={n: np.zeros_like(weights[n]) for n in names})
    plain = make_worker(tmp_path / "plain", data).answer(announce("scaffold", 2, state, momentum=0.0), state)
    ask = announce("scaffold", 2, state, momentum=0.0).model_copy(update={"compression": "topk:0.1"})
    update = decode_message(encode_message(make_worker(tmp_path / "topk", data).answer(ask, state)), Update)
    assert not update.control_delta and sorted(update.packed_control_delta) == sorted(names)
    sent = unpack_arrays(update.packed_control_delta)
    total = sum(plain.control_delta[n].size for n in names)
    assert sum(np.count_nonzero(sent[n]) for n in names) <= int(np.ceil(0.1 * total))
    residual = AgentStateDir(tmp_path / "topk").read_arrays(f"ef-{RUN}-{FAMILY}")
    assert residual is not None and {f"control/{n}" for n in names} <= residual.keys()
    for name in names:  # what was held back plus what was sent is the control delta the agent computed
        np.testing.assert_allclose(residual[f"control/{name}"] + sent[name], plain.control_delta[name], rtol=1e-5,
                                   atol=1e-6)


def test_a_round_left_out_of_the_sum_has_its_variate_step_undone(tmp_path: Path) -> None:
    data = digits_subset()
    first = make_worker(tmp_path, data).answer(announce("scaffold", 1, momentum=0.0), None)
    after_round_1 = control_of(tmp_path)
    state = global_state(FAMILY, 2, weights=first.weights,
                         control={n: np.zeros_like(a) for n, a in first.control_delta.items()})
    second = make_worker(tmp_path, data).answer(announce("scaffold", 2, state, momentum=0.0), state)
    assert any(np.abs(v).max() > 0 for v in second.control_delta.values())  # round 2 moved the variate
    store = AgentStateDir(tmp_path)

    assert not revert_control(store, RUN, FAMILY, 1)  # not the round stored last: nothing to undo
    assert not revert_control(store, "another-run", FAMILY, 2)
    assert revert_control(store, RUN, FAMILY, 2)
    for name, value in control_of(tmp_path).items():
        np.testing.assert_array_equal(value, after_round_1[name])

    # Round 3 starts from round 1's variate, as if round 2 had never been answered.
    third = make_worker(tmp_path, data).answer(announce("scaffold", 3, state, momentum=0.0), state)
    stored = store.read_arrays(f"scaffold-{RUN}-{FAMILY}")
    assert stored is not None and int(stored["round"]) == 3 and third.control_delta
    for name, value in after_round_1.items():
        np.testing.assert_array_equal(stored[f"before/{name}"], value)
