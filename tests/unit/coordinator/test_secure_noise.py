"""Distributed DP under secure aggregation: each agent bounds its delta's L2 norm, weighs it and adds its share of
Gaussian noise before quantising, or of Skellam noise on the grid after rounding (protocol/secagg/vector.py), so the unmasked sum carries noise_multiplier x clip_norm;
the coordinator announces the noise, accounts every released sum (coordinator/state/central_privacy.py), keeps the
ledger across restarts, and refuses at start-up what it cannot noise or afford."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.round.secure_plan import NOISE_SIGMAS, fine_enough
from coordinator.settings import CoordinatorSettings
from protocol.secagg.accounting import SKELLAM_MAX_POISSON, epsilon_of, gaussian_rdp, round_rdp, skellam_levels
from protocol.secagg.ring import ring_bits, signed
from protocol.secagg.vector import encode_input, quantiser, skellam
from protocol.secagg.wire import SecureFamily, SecureNoise, SecureSetup
from tests.unit.coordinator.test_engine import Clock, make_engine
from tests.unit.coordinator.test_secure_rounds import AGENTS, SAMPLES, SECURE, Fleet, deltas

NOISE = {"secagg_noise_multiplier": 0.5, "secagg_dp_clip_norm": 1.0}


def setup_with_noise(n_params: int, shares: int = 4, noise_multiplier: float = 1.0,
                     mechanism: str = "gaussian") -> tuple[SecureSetup, SecureFamily]:
    family = SecureFamily(roster=["a", "b", "c", "d"], graph_seed=bytes(32), degree=3, threshold=2,
                          n_params=n_params, weight_cap=10, ring_bits=32)
    noise = SecureNoise(noise_multiplier=noise_multiplier, clip_norm=1.0, shares=shares, mechanism=mechanism)
    clip = 1.0 + 7 * noise.agent_std
    levels = skellam_levels(noise.agent_std, clip, 4) if mechanism == "skellam" else 0  # as the plan sets them
    if levels:
        family = family.model_copy(update={"ring_bits": ring_bits(levels, 4)})
    return SecureSetup(clip=clip, advertise_s=1, share_s=1, unmask_s=1, families={"f": family}, noise=noise,
                       levels=levels), family


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


def test_skellam_noise_is_whole_grid_steps_added_after_rounding_on_a_grid_its_sampler_holds() -> None:
    setup, family = setup_with_noise(10, mechanism="skellam")
    grid = quantiser(setup, family)
    variance = (setup.noise.agent_std * grid.scale) ** 2
    assert variance / 2 <= SKELLAM_MAX_POISSON < 2 * variance  # as fine a grid as the Poisson sampler allows
    delta = {"w": np.full((3, 3), 10.0, np.float32)}  # norm 30: scaled to 1
    plain, ring = encode_input(delta, setup, family, samples=5, rng=np.random.default_rng(7))
    steps = np.append(skellam(np.random.default_rng(7), variance, 9), 0)
    scaled = np.append(np.full(9, 0.5 / 3.0), 0.5 * setup.clip) * grid.scale
    rounded = signed(ring, family.ring_bits).astype(np.int64) - steps.astype(np.int64)  # stochastic: floor or ceil
    assert np.all((rounded == np.floor(scaled)) | (rounded == np.ceil(scaled)))
    assert np.abs(steps).max() > 1000  # the noise is many grid steps: not a rounding's worth
    np.testing.assert_allclose(plain[:-1], 0.5 / 3.0 + steps[:-1] / grid.scale, rtol=0, atol=1e-12)
    assert plain[-1] == 0.5 * setup.clip


@pytest.mark.parametrize("mechanism", ["gaussian", "skellam"])
def test_the_shares_of_the_agents_sum_to_the_announced_noise(mechanism: str) -> None:
    n = 200_001
    setup, family = setup_with_noise(n, shares=4, noise_multiplier=2.0, mechanism=mechanism)
    zero = {"w": np.zeros(n - 1, np.float32)}
    total = sum(encode_input(zero, setup, family, samples=10)[0][:-1] for _ in range(4))
    assert np.std(total) == pytest.approx(2.0 * 1.0, rel=0.01)  # noise_multiplier x clip_norm, 200,000 draws
    assert np.abs(total).max() < setup.clip * 4  # the grid's range was never reached


def test_under_skellam_a_family_whose_grid_is_too_coarse_for_its_model_sits_out() -> None:
    noise = SecureNoise(noise_multiplier=1.0, clip_norm=1.0, shares=2, mechanism="skellam")
    clip = 1.0 + 7 * noise.agent_std
    roster = [f"a{i:04d}" for i in range(1000)]  # 1,000 summands on 32 bits: about 360,000 steps per clip norm
    small, large = (SecureFamily(roster=roster, graph_seed=bytes(32), degree=30, threshold=16, n_params=n,
                                 weight_cap=10) for n in (1_000_001, 100_000_001))
    skipped: list[str] = []
    kept = fine_enough({"small": small, "large": large}, clip, 0, noise, 3, skipped)
    assert list(kept) == ["small"]
    assert len(skipped) == 1 and skipped[0].startswith("large: its grid holds the DP clip norm in")


@pytest.mark.parametrize("mechanism", ["skellam", "gaussian"])
def test_a_noisy_secure_round_is_announced_accounted_and_remembered_across_a_restart(tmp_path: Path,
                                                                                   mechanism: str) -> None:
    settings = {**NOISE, "secagg_noise_mechanism": mechanism}
    fleet = Fleet(tmp_path, **settings)
    ann, base = fleet.announcement(), fleet.state(2)
    assert ann.secure is not None and ann.secure.noise is not None
    noise = ann.secure.noise
    assert (noise.noise_multiplier, noise.clip_norm, noise.shares, noise.mechanism) == (0.5, 1.0, 2, mechanism)
    assert ann.secure.clip == pytest.approx(1.0 + NOISE_SIGMAS * 0.5 / np.sqrt(2))
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    sent = deltas(9)
    fleet.train(sent)
    fleet.pump()
    summary = fleet.engine.last_summary
    assert (summary.round, summary.outcome) == (2, "completed"), summary
    expected_epsilon = epsilon_of(round_rdp(ann.secure, ann.secure.families.values()), 1e-5)[0]
    gaussian_epsilon = epsilon_of(gaussian_rdp(0.5, 1), 1e-5)[0]  # what the fine grid's Skellam noise comes close to
    assert expected_epsilon == pytest.approx(gaussian_epsilon, rel=1e-9 if mechanism == "gaussian" else 1e-3)
    assert expected_epsilon >= gaussian_epsilon
    assert summary.secure["noise"]["rounds"] == 1 and summary.secure["noise"]["mechanism"] == mechanism
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
    again, _, metrics = make_engine(tmp_path, Clock(), **{**SECURE, **settings})
    assert again.engine.parts.central_ledger.rounds == 1
    assert metrics.registry.get_sample_value("fl_secagg_dp_epsilon") == pytest.approx(expected_epsilon)


@pytest.mark.parametrize("override, named", [
    ({"secure_aggregation": False}, "needs secure_aggregation"),
    ({"algorithm": "scaffold", "momentum": 0.0}, "control deltas would leave without noise"),
    ({"compression": "int8"}, "needs compression none"),
    ({"secagg_dp_target_epsilon": 3.0, "rounds": 50}, r"affords 0 secure rounds at secagg_noise_multiplier 1 \(skellam\)"),
    ({"secagg_dp_target_epsilon": 3.0, "rounds": 50, "secagg_noise_mechanism": "gaussian"}, r"\(gaussian\)"),
    ({"secagg_noise_mechanism": "laplace"}, "secagg_noise_mechanism"),
])
def test_start_up_refuses_noise_it_cannot_add_or_afford(override: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        CoordinatorSettings(**{**SECURE, "enrollment": "open", "secagg_noise_multiplier": 1.0, **override})
    for mechanism in ("skellam", "gaussian"):
        fits = {**SECURE, "enrollment": "open", "secagg_noise_multiplier": 20.0, "secagg_dp_target_epsilon": 3.0,
                "rounds": 20, "secagg_noise_mechanism": mechanism}
        assert CoordinatorSettings(**fits).secagg_dp_target_epsilon == 3.0
