"""The attack harness (tests and benchmarks only): each behaviour against its definition."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.attacks import (
    Attack,
    AttackContext,
    GaussianNoise,
    InProcessCollusion,
    LabelFlip,
    LittleIsEnough,
    Scaling,
    SignFlip,
    build_attack,
    flip_labels,
    forge_payload,
)
from edge_agent.config import AgentSettings
from edge_agent.data.local import build_local_data
from edge_agent.state import AgentStateDir
from edge_agent.tasks.registry import resolve_task
from edge_agent.weights import get_arrays
from edge_agent.worker import LocalWorker
from protocol.errors import ProtocolError, Reason
from protocol.messages import GlobalState, LocalTraining, RoundAnnouncement, StateRef
from service_kit.settings import ConfigError, load_settings
from tests.task_refs import family_layouts

TASK = resolve_task("digits")

CONTEXT = AttackContext("evil-1", "run", 3, "mlp_tiny")


def delta(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32),
            "steps": np.array(7, dtype=np.int64)}


def test_sign_flip_and_scaling_multiply_the_floats_only() -> None:
    honest = delta()
    flipped = SignFlip(4.0).forge(honest, CONTEXT)
    boosted = Scaling(10.0).forge(honest, CONTEXT)
    for name in ("w", "b"):
        np.testing.assert_allclose(flipped[name], -4.0 * honest[name], rtol=1e-6)
        np.testing.assert_allclose(boosted[name], 10.0 * honest[name], rtol=1e-6)
        assert flipped[name].dtype == np.float32
    assert flipped["steps"] == 7 and boosted["steps"] == 7
    assert Scaling.poisons_labels and not SignFlip.poisons_labels


def test_gaussian_noise_replaces_the_update_with_seeded_noise_of_the_set_scale() -> None:
    honest = {"w": np.full(200_000, 0.01, dtype=np.float32)}  # RMS 0.01
    noise = GaussianNoise(10.0).forge(honest, CONTEXT)["w"]
    assert abs(float(noise.std()) - 0.1) < 0.002 and abs(float(noise.mean())) < 0.002
    np.testing.assert_array_equal(noise, GaussianNoise(10.0).forge(honest, CONTEXT)["w"])  # same agent and round
    other_round = AttackContext("evil-1", "run", 4, "mlp_tiny")
    assert not np.array_equal(noise, GaussianNoise(10.0).forge(honest, other_round)["w"])


def test_label_flip_maps_y_to_c_minus_1_minus_y() -> None:
    data = build_local_data(TASK).train
    flipped = flip_labels(data)
    np.testing.assert_array_equal(flipped.y, 9 - data.y)
    assert flipped.x is data.x
    assert LabelFlip().poison(data).y.tolist() == flipped.y.tolist()
    assert LabelFlip().forge(delta(), CONTEXT)["w"] is not None


def test_alie_colluders_send_mean_minus_z_std_of_their_benign_updates() -> None:
    collusion = InProcessCollusion(members=3, timeout_s=30)
    attack = LittleIsEnough(1.5, collusion)
    benign = [delta(seed) for seed in range(3)]
    results: dict[int, dict[str, np.ndarray]] = {}

    def run(i: int) -> None:
        results[i] = attack.forge(benign[i], AttackContext(f"evil-{i}", "run", 3, "mlp_tiny"))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name in ("w", "b"):
        stacked = np.stack([b[name].astype(np.float64) for b in benign])
        expected = (stacked.mean(axis=0) - 1.5 * stacked.std(axis=0)).astype(np.float32)
        for i in range(3):
            np.testing.assert_allclose(results[i][name], expected, rtol=1e-6)
    assert results[0]["steps"] == 7
    assert attack.report() == {"attack_alie": 1.0, "attack_z": 1.5, "attack_colluders": 3.0}


def test_a_missing_colluder_does_not_stall_the_others() -> None:
    collusion = InProcessCollusion(members=2, timeout_s=0.2)
    honest = delta()
    forged = LittleIsEnough(1.0, collusion).forge(honest, CONTEXT)
    np.testing.assert_allclose(forged["w"], honest["w"])  # alone: std 0, the mean is its own update


def test_a_bootstrap_proposal_is_attacked_in_its_weights_themselves() -> None:
    init = {"w": np.array([1.5, 0.5, 1.0], dtype=np.float32), "n": np.array(4)}  # what an honest agent proposes
    sent = forge_payload(SignFlip(2.0), {"weights": init}, init, CONTEXT)
    np.testing.assert_allclose(sent["weights"]["w"], [-3.0, -1.0, -2.0])  # type: ignore[index]
    assert sent["weights"]["w"].dtype == np.float32 and sent["weights"]["n"] == 4  # type: ignore[index]
    sent = forge_payload(SignFlip(2.0), {"delta": {"w": np.array([1.0], dtype=np.float32)}}, None, CONTEXT)
    np.testing.assert_allclose(sent["delta"]["w"], [-2.0])  # type: ignore[index]


def test_settings_and_build() -> None:
    assert build_attack("none") is None
    assert isinstance(build_attack("sign_flip"), SignFlip) and build_attack("sign_flip").scale == 4.0  # type: ignore[union-attr]
    assert build_attack("scaling").scale == 10.0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="needs colluders"):
        build_attack("alie")
    with pytest.raises(ConfigError, match="attack_scale has no effect"):
        load_settings(AgentSettings, overrides={"attack": "label_flip", "attack_scale": 2.0})
    with pytest.raises(ConfigError, match="attack_z has no effect"):
        load_settings(AgentSettings, overrides={"attack": "sign_flip", "attack_z": 2.0})
    with pytest.raises(ConfigError, match="attack"):
        load_settings(AgentSettings, overrides={"attack": "backdoor"})
    assert AgentSettings().attack == "none"


def test_an_attacking_worker_sends_the_forged_update_and_admits_it(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = build_local_data(TASK, partition="iid", num_partitions=8, partition_index=0)
    announcement = RoundAnnouncement(
        run_id="run", round=1, task="train", task_ref=TASK.card.ref, layouts=family_layouts(["mlp_tiny"]),
        algorithm="fedavg", selected=["honest", "evil"],
        training=LocalTraining(epochs=1, learning_rate=0.05), init_seed=0, issued_at=0.0, deadline_s=10.0,
        last_round=3)
    device = torch.device("cpu")

    def worker(attack: Attack | None, name: str) -> LocalWorker:
        # One agent id for both, so both train with the same seed: the honest update is the
        # one the attacker computed before forging it.
        return LocalWorker("same", TASK, "mlp_tiny", data, device, 16, AgentStateDir(tmp_path / name), attack=attack)

    honest = worker(None, "honest").answer(announcement, None)  # a bootstrap round: the initial weights
    evil = worker(SignFlip(3.0), "evil").answer(announcement, None)
    assert "attack_sign_flip" not in honest.metrics.extra
    assert evil.metrics.extra["attack_sign_flip"] == 1.0 and evil.metrics.extra["attack_scale"] == 3.0
    start = get_arrays(TASK.build_model("mlp_tiny", seed=0))
    for name in honest.weights:
        assert honest.weights[name].tobytes() == start[name].tobytes()
        np.testing.assert_allclose(evil.weights[name], -3.0 * start[name], rtol=1e-6)
    weights = {k: v.copy() for k, v in start.items()}  # a training round: the delta is forged
    state = GlobalState(run_id="run", family="mlp_tiny", round=2, weights=weights, control={},
                        digest=GlobalState.compute_digest(weights, {}, None, None))
    training = announcement.model_copy(update={"round": 2, "states": {
        "mlp_tiny": StateRef(family="mlp_tiny", round=2, digest=state.digest)}})
    honest = worker(None, "honest").answer(training, state)
    evil = worker(SignFlip(3.0), "evil").answer(training, state)
    for name in honest.delta:
        np.testing.assert_allclose(evil.delta[name], -3.0 * honest.delta[name], rtol=1e-4, atol=1e-6)


def test_a_global_model_that_makes_training_diverge_skips_the_round_instead_of_crashing(tmp_path: Path) -> None:
    data = build_local_data(TASK, partition="iid", num_partitions=8, partition_index=1)
    model = TASK.build_model("mlp_tiny", seed=0)
    huge = {k: (v * np.float32(1e30)).astype(v.dtype) for k, v in get_arrays(model).items()}  # finite, but overflows
    state = GlobalState(run_id="run", family="mlp_tiny", round=2, digest=GlobalState.compute_digest(huge, {}, None, None),
                        weights=huge)
    announcement = RoundAnnouncement(
        run_id="run", round=2, task="train", task_ref=TASK.card.ref, layouts=family_layouts(["mlp_tiny"]),
        algorithm="fedavg", selected=["a"], training=LocalTraining(
            epochs=1, learning_rate=0.05), states={"mlp_tiny": StateRef(family="mlp_tiny", round=2, digest=state.digest)},
        init_seed=0, issued_at=0.0, deadline_s=10.0, last_round=3)
    worker = LocalWorker("a", TASK, "mlp_tiny", data, torch.device("cpu"), 16, AgentStateDir(tmp_path))
    with pytest.raises(ProtocolError) as info:
        worker.answer(announcement, state)
    assert info.value.reason is Reason.NON_FINITE  # the agent loop logs it and waits for the next round


def test_the_cli_refuses_alie_without_colluders_with_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "edge_agent", "run", "--attack", "alie", "--state-dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert "error: cannot start: attack alie needs colluders" in result.stderr and "Traceback" not in result.stderr
