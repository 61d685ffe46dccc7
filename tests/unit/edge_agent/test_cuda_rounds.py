"""The Jetson profile's CUDA path, through the real worker: a round trained on the GPU sends what the
same round on the CPU sends, for every algorithm, in later rounds too (state saved and loaded on each
device), DP-SGD spends the same budget, and what leaves the worker is host memory that encodes.

Needs a CUDA device, so CI (no GPU) skips this module; ``scripts/cuda-check.sh`` runs it on one.
With TF32 off (the agent's default, ``edge_agent.profiles.set_tf32``) the two devices differ only in
the order they add in: on an H200 the updates' relative distance stayed near 1e-6. Rounds are kept
to ``STEPS`` steps: further on, a max-pool or ReLU choice between two values that rounding reorders
turns that 1e-6 into percent-level differences (seen after 16 steps between 1 and 2 CPU threads too).
A tensor on the wrong device raises; wrong data or a lost correction is off by far more than the bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.trainer import PrivateTrainer
from edge_agent.profiles import get_profile, set_tf32
from edge_agent.state import AgentStateDir
from edge_agent.worker import LocalWorker
from protocol.messages import RoundAnnouncement, Update
from protocol.wire import decode_message, encode_message
from tests.unit.edge_agent.rounds import AGENT, TASK, announce, digits_subset, global_state, global_weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CPU = torch.device("cpu")
JETSON = get_profile("jetson")
FAMILY = TASK.family_for(JETSON.name)
SAME_WITHIN = 1e-4
"""Largest relative distance between the GPU's and the CPU's update that counts as the same round."""
STEPS = 4
DATA = digits_subset(per_class=30)


@pytest.fixture(autouse=True)
def float32_products() -> Iterator[None]:
    """What ``build_agent`` sets for an agent on CUDA unless ``tf32`` is on; torch's flags restored after."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    set_tf32(False)
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def worker(state_dir: Path, device: torch.device, dp: bool = False) -> LocalWorker:
    state = AgentStateDir(state_dir)
    config = DPConfig(noise_multiplier=1.0, budget_epsilon=100.0, prototype_noise_multiplier=2.0)
    privacy = PrivateTrainer.open(config, state) if dp else None
    return LocalWorker(AGENT, TASK, FAMILY, DATA, device, batch_size=32, state=state, privacy=privacy)


def short(announcement: RoundAnnouncement) -> RoundAnnouncement:
    """The round cut to ``STEPS`` steps, its learning rate and momentum kept."""
    training = announcement.training.model_copy(update={"epochs": 1, "steps": STEPS})
    return announcement.model_copy(update={"training": training})


def relative_distance(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> float:
    assert ours.keys() == theirs.keys() and ours
    return norm({n: ours[n].astype(np.float64) - theirs[n] for n in ours}) / norm(theirs)


def norm(arrays: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(a.astype(np.float64) ** 2) for a in arrays.values())))


def on_the_wire(update: Update) -> Update:
    """The update as the coordinator would read it: every array host memory, encoded and decoded back."""
    arrays = [*update.weights.values(), *update.delta.values(), *update.control_delta.values()]
    arrays += [a for a in (update.prototypes, update.prototype_counts) if a is not None]
    assert arrays and all(isinstance(a, np.ndarray) for a in arrays)
    return decode_message(encode_message(update), Update)


def test_the_jetson_profile_trains_on_the_gpu() -> None:
    assert JETSON.torch_device().type == "cuda"
    assert FAMILY == "cnn_large"


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold"])
def test_two_rounds_on_the_gpu_send_what_the_cpu_sends(tmp_path: Path, algorithm: str) -> None:
    params = {"mu": 0.1} if algorithm == "fedprox" else {}
    weights = global_weights(FAMILY)
    control = {n: np.zeros_like(a) for n, a in weights.items() if n in dict(TASK.build_model(FAMILY, 0)
                                                                              .named_parameters())}
    state = global_state(FAMILY, 2, weights=weights, control=control if algorithm == "scaffold" else None)
    field = "delta"
    for round_number in (2, 3):  # round 3 starts from what round 2 saved (SCAFFOLD's variate)
        if round_number == 3:
            state = global_state(FAMILY, 3, weights=weights, control=state.control)
        ann = short(announce(algorithm, round_number, state, params=params,
                             momentum=0.0 if algorithm == "scaffold" else 0.9))
        gpu = on_the_wire(worker(tmp_path / "gpu", JETSON.torch_device()).answer(ann, state))
        cpu = on_the_wire(worker(tmp_path / "cpu", CPU).answer(ann, state))
        assert relative_distance(getattr(gpu, field), getattr(cpu, field)) < SAME_WITHIN, round_number
        if algorithm == "scaffold":
            assert relative_distance(gpu.control_delta, cpu.control_delta) < SAME_WITHIN, round_number
        assert gpu.metrics.train_loss == pytest.approx(cpu.metrics.train_loss, rel=SAME_WITHIN)


def test_fedproto_prototypes_and_personal_model_on_the_gpu_match_the_cpu(tmp_path: Path) -> None:
    first = short(announce("fedproto", 1, None, params={"lambda": 1.0}))
    gpu = on_the_wire(worker(tmp_path / "gpu", JETSON.torch_device()).answer(first, None))
    cpu = on_the_wire(worker(tmp_path / "cpu", CPU).answer(first, None))
    assert gpu.prototypes is not None and cpu.prototypes is not None
    assert relative_distance({"p": gpu.prototypes}, {"p": cpu.prototypes}) < SAME_WITHIN
    np.testing.assert_array_equal(gpu.prototype_counts, cpu.prototype_counts)
    # Round 2 loads each device's personal model from its state dir and aligns to the global prototypes.
    state = global_state(FAMILY, 2, prototypes=cpu.prototypes, counts=cpu.prototype_counts)
    second = short(announce("fedproto", 2, state, params={"lambda": 1.0}))
    gpu2 = on_the_wire(worker(tmp_path / "gpu", JETSON.torch_device()).answer(second, state))
    cpu2 = on_the_wire(worker(tmp_path / "cpu", CPU).answer(second, state))
    assert relative_distance({"p": gpu2.prototypes}, {"p": cpu2.prototypes}) < SAME_WITHIN
    assert gpu2.metrics.extra["proto_accuracy"] == pytest.approx(cpu2.metrics.extra["proto_accuracy"], abs=0.05)
    personal = AgentStateDir(tmp_path / "gpu").names("fedproto-")
    assert personal, "the GPU round kept no personal model"


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedproto"])
def test_dp_sgd_on_the_gpu_spends_what_the_cpu_spends(tmp_path: Path, algorithm: str) -> None:
    """DP noise is secret, so the updates differ; the accounting must not, and the update must be usable."""
    weights = global_weights(FAMILY)
    names = dict(TASK.build_model(FAMILY, 0).named_parameters())
    control = {n: np.zeros_like(a) for n, a in weights.items() if n in names}
    state = None if algorithm == "fedproto" else global_state(
        FAMILY, 2, weights=weights, control=control if algorithm == "scaffold" else None)
    ann = announce(algorithm, 2, state, params={"lambda": 1.0} if algorithm == "fedproto" else {},
                   momentum=0.0 if algorithm == "scaffold" else 0.9)
    gpu_worker, cpu_worker = worker(tmp_path / "gpu", JETSON.torch_device(), dp=True), worker(tmp_path / "cpu", CPU,
                                                                                               dp=True)
    gpu, cpu = on_the_wire(gpu_worker.answer(ann, state)), on_the_wire(cpu_worker.answer(ann, state))
    assert gpu.privacy is not None and cpu.privacy is not None
    assert gpu.privacy.epsilon == pytest.approx(cpu.privacy.epsilon, rel=1e-9) and gpu.privacy.epsilon > 0
    if algorithm == "fedproto":
        assert gpu.prototypes is not None and np.isfinite(gpu.prototypes).all()
        assert gpu.prototype_counts is not None and gpu.prototype_counts.sum() > 0
    else:
        assert all(np.isfinite(a).all() for a in gpu.delta.values())
        assert 0.5 < norm(gpu.delta) / norm(cpu.delta) < 2.0  # the same clipping and noise scale on either device

