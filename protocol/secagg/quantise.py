"""Fixed-point quantisation of float updates into the ring Z_{2^b} (b <= 32), and back for the sum.

Values are clipped to [-clip, clip] and scaled to integers in [-bound, bound] so that the sum of
``max_summands`` of them stays inside the signed b-bit range: the ring sum then reads back exactly
as the integer sum (no wrap). ``levels`` 0 takes the finest bound the ring allows; a compression grid
(``protocol.secagg.ring.GRID_LEVELS``, e.g. 127 for int8) fixes it, and then the ring must be wide
enough (``ring.ring_bits``): a declaration that could wrap is refused here. The step (the error of
one value) is 1 / scale with stochastic rounding, half of it with nearest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protocol.secagg.ring import RING_BITS, signed

_HALF_RING = (1 << 31) - 1


@dataclass(frozen=True)
class Quantiser:
    clip: float
    max_summands: int
    stochastic: bool = False
    ring_bits: int = RING_BITS
    levels: int = 0  # the largest |integer| of one value; 0: as many as the ring allows

    def __post_init__(self) -> None:
        if not (np.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a positive finite number, not {self.clip}")
        if not 1 <= self.max_summands <= _HALF_RING:
            raise ValueError(f"max_summands must be in 1..{_HALF_RING}")
        if not 2 <= self.ring_bits <= RING_BITS or self.levels < 0:
            raise ValueError(f"a ring of 2 to {RING_BITS} bits and levels >= 0, not 2^{self.ring_bits}, {self.levels}")
        half = (1 << (self.ring_bits - 1)) - 1
        if self.bound < 1 or self.max_summands * self.bound > half:
            raise ValueError(f"{self.max_summands} values in [-{self.bound}, {self.bound}] can sum past "
                             f"{half}: a ring of 2^{self.ring_bits} would wrap")

    @property
    def bound(self) -> int:
        """The largest |integer| one value quantises to; max_summands * bound < 2^(ring_bits - 1)."""
        return self.levels or ((1 << (self.ring_bits - 1)) - 1) // self.max_summands

    @property
    def scale(self) -> float:
        return self.bound / self.clip

    @property
    def step(self) -> float:
        return 1.0 / self.scale

    def quantise(self, values: np.ndarray, rng: np.random.Generator | None = None,
                 integer_noise: np.ndarray | None = None) -> np.ndarray:
        """Float array -> uint32 ring elements (two's complement). Refuses NaN and infinities. ``integer_noise``
        (whole grid steps, as float64: exact below 2^53) is added after rounding, before the bound is enforced."""
        scaled = np.asarray(values).astype(np.float64)  # a copy, worked on in place below
        if not np.all(np.isfinite(scaled)):
            raise ValueError("an update to quantise holds NaN or infinity")
        np.clip(scaled, -self.clip, self.clip, out=scaled)
        scaled *= self.scale
        if self.stochastic:
            rng = rng if rng is not None else np.random.default_rng()
            scaled += rng.random(scaled.shape)
            np.floor(scaled, out=scaled)
        else:
            np.rint(scaled, out=scaled)
        if integer_noise is not None:
            scaled += integer_noise
        # clip * scale is the integer bound up to a rounding of the product: keep it from stepping past.
        np.clip(scaled, -self.bound, self.bound, out=scaled)
        return scaled.astype(np.int32).view(np.uint32)

    def dequantise_sum(self, total: np.ndarray, count: int) -> np.ndarray:
        """The ring sum of ``count`` quantised updates (uint32, its low ``ring_bits`` bits count) -> their float64 sum."""
        if not 0 <= count <= self.max_summands:
            raise ValueError(f"{count} summands exceed the declared max_summands {self.max_summands}")
        return signed(total, self.ring_bits).astype(np.float64) / self.scale

    def dequantise_mean(self, total: np.ndarray, count: int) -> np.ndarray:
        if count < 1:
            raise ValueError("the mean of no updates")
        return self.dequantise_sum(total, count) / count
