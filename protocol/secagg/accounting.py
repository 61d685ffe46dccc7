"""What distributed DP's noise costs (``SecureNoise``): Renyi DP of the Gaussian or Skellam mechanism, composed over rounds.

A secure round under noise multiplier z releases, per family, a sum that one device changes by at most the clip
norm C and that carries noise of standard deviation at least z C. Gaussian: its Renyi DP of order a is
a / (2 z^2) (Mironov, 2017). Skellam: the sum is taken on the integer grid, where one device's rounded vector has
L2 norm at most scale C + sqrt(d) / 2 (nearest rounding moves each of its d values by half a step at most) and the
noise is Skellam of variance mu per value; Agarwal, Kairouz and Liu (NeurIPS 2021, Theorem 3.5) bound its RDP at
integer orders a > 1 by a D2^2 / (2 mu) + min(((2a - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu)) for L1 and L2
sensitivities D1, D2. A fractional order takes the next integer's bound (Renyi divergence grows with the order).
Families' sums hold disjoint agents: a round costs its dearest family. Rounds compose by adding. Epsilon for a delta
comes from the conversion of Balle et al. (2020) and Canonne, Kamath and Steinke (2020), the one Opacus uses,
minimised over the orders held. No amplification by sampling: the coordinator chooses the agents, and nothing keeps
the choice secret. Pure numpy: the coordinator's settings check a target with it before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from protocol.secagg.vector import quantiser
from protocol.secagg.wire import SecureFamily, SecureSetup

ORDERS = np.array([1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0,
                   96.0, 128.0, 256.0, 512.0, 1024.0])
"""Renyi orders the curve is kept at (more orders: a tighter minimum, the same guarantee)."""


def gaussian_rdp(noise_multiplier: float, rounds: int = 1) -> np.ndarray:
    """RDP at ``ORDERS`` of ``rounds`` Gaussian mechanisms of sensitivity 1 and noise ``noise_multiplier``."""
    if noise_multiplier <= 0 or rounds < 0:
        raise ValueError(f"a noise multiplier > 0 and rounds >= 0, not {noise_multiplier}, {rounds}")
    return rounds * ORDERS / (2.0 * noise_multiplier**2)


SKELLAM_MIN_STEPS = 50.0
"""A Skellam round needs scale x C >= this x sqrt(d) (the grid fine next to the sensitivity, so that rounding adds
at most 2% to it); a family's grid too coarse for it sits out. It is also what ``skellam_round_bound`` assumes."""
SKELLAM_MAX_POISSON = float(1 << 39)
"""The largest Poisson mean an agent draws (half its Skellam variance in grid steps). numpy's sampler keeps the
variance within sampling error up to 1e13 here, but is 2% short at 1e15 and 20% over at 2^51: a 32-bit ring's finest
grid would ask for 2^51 and more, so a Skellam round announces a coarser grid (``skellam_levels``)."""


def skellam_rdp(l2: float, l1: float, variance: float, rounds: int = 1) -> np.ndarray:
    """RDP at ``ORDERS`` of ``rounds`` Skellam mechanisms: integer-grid sensitivities ``l2``, ``l1``, and noise of
    ``variance`` per value (in grid steps squared)."""
    if not (l2 > 0 and l1 > 0 and variance > 0) or rounds < 0:
        raise ValueError(f"sensitivities and a variance > 0, rounds >= 0, not {l2}, {l1}, {variance}, {rounds}")
    a = np.ceil(ORDERS)
    second = np.minimum(((2 * a - 1) * l2**2 + 6 * l1) / (4 * variance**2), 3 * l1 / (2 * variance))
    return rounds * (a * l2**2 / (2 * variance) + second)


def skellam_family_rdp(noise_multiplier: float, clip_norm: float, scale: float, values: int,
                       rounding: float = 1.0) -> np.ndarray:
    """One family's noisy sum on a grid of ``scale`` steps per unit, ``values`` noised values, noise multiplier z,
    rounding that moves a value by at most ``rounding`` steps (1: stochastic, 0.5: nearest): D2 = scale C +
    rounding sqrt(d), D1 = min(sqrt(d) D2, D2^2) (integer vectors), variance (z scale C)^2."""
    l2 = scale * clip_norm + rounding * math.sqrt(values)
    return skellam_rdp(l2, min(math.sqrt(values) * l2, l2**2), (noise_multiplier * scale * clip_norm) ** 2)


def skellam_round_bound(noise_multiplier: float) -> np.ndarray:
    """An upper bound of one round's ``skellam_family_rdp`` for any family whose grid meets ``SKELLAM_MIN_STEPS``
    (the bound's terms all shrink as scale C / sqrt(d) grows, and d >= 1): what start-up checks a target with."""
    return skellam_family_rdp(noise_multiplier, 1.0, SKELLAM_MIN_STEPS, 1)


def skellam_levels(agent_std: float, clip: float, summands: int) -> int:
    """The grid of a Skellam round: as fine as the ring allows for ``summands`` values in [-clip, clip], but no finer
    than keeps an agent's Poisson mean (agent_std x levels / clip)^2 / 2 within ``SKELLAM_MAX_POISSON``."""
    finest = ((1 << 31) - 1) // summands
    return max(1, min(finest, math.floor(math.sqrt(2 * SKELLAM_MAX_POISSON) * clip / agent_std)))


def round_rdp(setup: SecureSetup, families: Iterable[SecureFamily]) -> np.ndarray:
    """What releasing the sums of ``families`` under ``setup.noise`` costs: the dearest family's curve."""
    noise = setup.noise
    if noise is None:
        raise ValueError("the round adds no noise: its sums are not differentially private")
    if noise.mechanism == "gaussian":
        return gaussian_rdp(noise.noise_multiplier)
    curves = [skellam_family_rdp(noise.noise_multiplier, noise.clip_norm, quantiser(setup, family).scale,
                                 family.n_params - 1, 1.0 if setup.levels else 0.5) for family in families]
    if not curves:
        raise ValueError("no family's sum was released")
    return np.max(curves, axis=0)


def epsilon_of(rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """(epsilon, the order it was taken at) of an RDP curve at ``ORDERS``, for ``delta``."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), not {delta}")
    a = ORDERS
    eps = rdp + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


def affordable_rounds(per_round: np.ndarray, delta: float, target_epsilon: float) -> int:
    """The most rounds of RDP ``per_round`` each whose epsilon stays within ``target_epsilon`` (0: not even one)."""
    low, high = 0, 1
    while epsilon_of(high * per_round, delta)[0] <= target_epsilon:
        low, high = high, high * 2
        if high > 1 << 30:
            return low  # checked to cost no more than the target: enough rounds for any run
    while high - low > 1:  # epsilon grows with rounds: bisect
        middle = (low + high) // 2
        if epsilon_of(middle * per_round, delta)[0] <= target_epsilon:
            low = middle
        else:
            high = middle
    return low
