"""What distributed DP's noise costs (``SecureNoise``): Renyi DP of the Gaussian mechanism, composed over rounds.

A secure round under noise multiplier z releases, per family, a sum that one device changes by at most the clip
norm C and that carries Gaussian noise of standard deviation at least z C: the Gaussian mechanism, whose Renyi
DP of order a is a / (2 z^2) (Mironov, 2017); rounds compose by adding. Epsilon for a delta comes from the
conversion of Balle et al. (2020) and Canonne, Kamath and Steinke (2020), the one Opacus uses, minimised over
the orders held. No amplification by sampling: the coordinator chooses the agents, and nothing keeps the
choice secret. Pure numpy: the coordinator's settings check a target with it before anything runs.
"""

from __future__ import annotations

import math

import numpy as np

ORDERS = np.array([1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0,
                   96.0, 128.0, 256.0, 512.0, 1024.0])
"""Renyi orders the curve is kept at (more orders: a tighter minimum, the same guarantee)."""


def gaussian_rdp(noise_multiplier: float, rounds: int = 1) -> np.ndarray:
    """RDP at ``ORDERS`` of ``rounds`` Gaussian mechanisms of sensitivity 1 and noise ``noise_multiplier``."""
    if noise_multiplier <= 0 or rounds < 0:
        raise ValueError(f"a noise multiplier > 0 and rounds >= 0, not {noise_multiplier}, {rounds}")
    return rounds * ORDERS / (2.0 * noise_multiplier**2)


def epsilon_of(rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """(epsilon, the order it was taken at) of an RDP curve at ``ORDERS``, for ``delta``."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), not {delta}")
    a = ORDERS
    eps = rdp + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


def affordable_rounds(noise_multiplier: float, delta: float, target_epsilon: float) -> int:
    """The most rounds whose epsilon stays within ``target_epsilon`` (0: not even one)."""
    low, high = 0, 1
    while epsilon_of(gaussian_rdp(noise_multiplier, high), delta)[0] <= target_epsilon:
        low, high = high, high * 2
        if high > 1 << 30:
            return high
    while high - low > 1:  # epsilon grows with rounds: bisect
        middle = (low + high) // 2
        if epsilon_of(gaussian_rdp(noise_multiplier, middle), delta)[0] <= target_epsilon:
            low = middle
        else:
            high = middle
    return low
