"""Distributed DP under secure aggregation: each agent bounds its delta's L2 norm, weighs it and adds its share of
Gaussian noise before masking (protocol/secagg/vector.py), so the unmasked sum carries noise_multiplier x clip_norm;
the coordinator announces the noise, accounts every released sum (coordinator/state/central_privacy.py), keeps the
ledger across restarts, and refuses at start-up what it cannot noise or afford."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from protocol.secagg.accounting import epsilon_of, gaussian_rdp
from protocol.secagg.vector import encode_input, quantiser
from protocol.secagg.wire import SecureFamily, SecureNoise, SecureSetup
from tests.unit.coordinator.test_engine import Clock, make_engine
from tests.unit.coordinator.test_secure_rounds import AGENTS, SAMPLES, SECURE, Fleet, deltas

NOISE = {"secagg_noise_multiplier": 0.5, "secagg_dp_clip_norm": 1.0}


def setup_with_noise(n_params: int, shares: int = 4, noise_multiplier: float = 1.0) -> tuple[SecureSetup, SecureFamily]:
    family = SecureFamily(roster=["a", "b", "c", "d"], graph_seed=bytes(32), degree=3, threshold=2,
                          n_params=n_params, weight_cap=10, ring_bits=32)
    noise = SecureNoise(noise_multiplier=noise_multiplier, clip_norm=1.0, shares=shares)
    return SecureSetup(clip=1.0 + 7 * noise.agent_std, advertise_s=1, share_s=1, unmask_s=1, families={"f": family},
                       noise=noise), family


def test_an_agent_bounds_its_norm_weighs_it_and_adds_its_share_of_the_noise() -> None:
    setup, family = setup_with_noise(10)
    delta = {"w": np.full((3, 3), 10.0, np.float32)}  # norm 30: scaled to 1
    plain, _ = encode_input(delta, setup, family, samples=5, rng=np.random.default_rng(7))
    noise = np.random.default_rng(7).normal(0.0, setup.noise.agent_std, 9)
    np.testing.assert_allclose(plain[:-1] - noise, np.full(9, 0.5 / 3.0), atol=1e-12)  # w = 0.5, |x| = 1
    assert plain[-1] == 0.5 * setup.clip  # the weight carries no noise: sample counts are public
    with pytest.raises(ValueError, match="noise to the delta only"):  # settings refuse SCAFFOLD with noise; so does this
        encode_input(delta, setup.model_copy(update={"control_clip": 1.0}), family, samples=5,
                     control={"w": np.zeros((3, 3), np.float32)})


def test_the_shares_of_the_agents_sum_to_the_announced_noise() -> None:
    n = 200_001
    setup, family = setup_with_noise(n, shares=4, noise_multiplier=2.0)
    zero = {"w": np.zeros(n - 1, np.float32)}
    total = sum(encode_input(zero, setup, family, samples=10)[0][:-1] for _ in range(4))
    assert np.std(total) == pytest.approx(2.0 * 1.0, rel=0.01)  # noise_multiplier x clip_norm, 200,000 draws
    assert np.abs(total).max() < setup.clip * 4  # the grid's range was never reached


def test_a_noisy_secure_round_is_announced_accounted_and_remembered_across_a_restart(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, **NOISE)
    ann, base = fleet.announcement(), fleet.state(2)
    assert ann.secure is not None and ann.secure.noise is not None
    noise = ann.secure.noise
    assert (noise.noise_multiplier, noise.clip_norm, noise.shares) == (0.5, 1.0, 2)  # split for the threshold
    assert ann.secure.clip == pytest.approx(1.0 + 7 * 0.5 / np.sqrt(2))
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = deltas(9)
    fleet.train(sent)
    fleet.pump()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome) == (2, "completed"), summary
    expected_epsilon = epsilon_of(gaussian_rdp(0.5, 1), 1e-5)[0]
    assert summary.secure["noise"]["rounds"] == 1
    assert summary.secure["noise"]["epsilon"] == pytest.approx(expected_epsilon, abs=1e-6)
    assert fleet.metrics.registry.get_sample_value("fl_secagg_dp_epsilon") == pytest.approx(expected_epsilon)
    fleet.engine.tick()
    # The mean moved by the agents' L2-bounded deltas plus the sum's noise (std 0.5 x sqrt(4 / 2) over the summed
    # weight 2.5): not the plain mean, and within 8 standard deviations of it.
    cap, step = ann.secure.families["f"].weight_cap, quantiser(ann.secure, ann.secure.families["f"]).step
    weights = {a: SAMPLES[a] / cap for a in AGENTS}
    bounded = {a: {n: v * min(1.0, 1.0 / np.sqrt(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in d.values())))
                   for n, v in d.items()} for a, d in sent.items()}
    moved = fleet.state(3)
    for name in ("w", "b"):
        expected = sum(weights[a] * bounded[a][name] for a in AGENTS) / sum(weights.values())
        off = np.abs(moved.weights[name] - base.weights[name] - expected)
        assert off.max() > 1e-4 and off.max() < 8 * 0.5 * np.sqrt(2) / 2.5 + 8 * step
    # A restarted coordinator resumes the ledger from its checkpoint.
    again, _, metrics = make_engine(tmp_path, Clock(), **{**SECURE, **NOISE})
    assert again.engine.parts.central_ledger.rounds == 1
    assert metrics.registry.get_sample_value("fl_secagg_dp_epsilon") == pytest.approx(expected_epsilon)


@pytest.mark.parametrize("override, named", [
    ({"secure_aggregation": False}, "needs secure_aggregation"),
    ({"algorithm": "scaffold", "momentum": 0.0}, "control deltas would leave without noise"),
    ({"compression": "int8"}, "needs compression none"),
    ({"secagg_dp_target_epsilon": 3.0, "rounds": 50}, "affords 0 secure rounds"),
])
def test_start_up_refuses_noise_it_cannot_add_or_afford(override: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        CoordinatorSettings(**{**SECURE, "enrollment": "open", "secagg_noise_multiplier": 1.0, **override})
    fits = {**SECURE, "enrollment": "open", "secagg_noise_multiplier": 20.0, "secagg_dp_target_epsilon": 3.0,
            "rounds": 20}
    assert CoordinatorSettings(**fits).secagg_dp_target_epsilon == 3.0
