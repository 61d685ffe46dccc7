"""Fixed-point quantisation into Z_2^32: sums never wrap, and come back within the step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.secagg.quantise import Quantiser


@settings(max_examples=80, deadline=None)
@given(clip=st.floats(1e-3, 1e3), count=st.integers(1, 300), stochastic=st.booleans(), seed=st.integers(0, 2**32),
       extreme=st.booleans())
def test_ring_sum_reads_back_as_the_float_sum(clip: float, count: int, stochastic: bool, seed: int,
                                              extreme: bool) -> None:
    q = Quantiser(clip, count, stochastic)
    rng = np.random.default_rng(seed)
    values = rng.uniform(-1.5 * clip, 1.5 * clip, (count, 16))
    if extreme:  # everyone at the same clip bound: the sum touches the end of the int32 range
        values[:] = clip if seed % 2 else -clip
    total = np.zeros(16, dtype=np.uint32)
    for row in values:
        total += q.quantise(row, rng)
    clipped = np.clip(values, -clip, clip)
    error = np.abs(q.dequantise_sum(total, count) - clipped.sum(axis=0))
    assert np.all(error <= count * q.step * (1.0 if stochastic else 0.5) * (1 + 1e-9))
    mean_error = np.abs(q.dequantise_mean(total, count) - clipped.mean(axis=0))
    assert np.all(mean_error <= q.step * (1 + 1e-9))


def test_stochastic_rounding_is_unbiased_on_average() -> None:
    q = Quantiser(1.0, 2**20, stochastic=True)  # a coarse step: 1/2047
    value = np.full(200_000, 0.3 * q.step)
    quantised = q.quantise(value, np.random.default_rng(1)).view(np.int32)
    assert set(np.unique(quantised)) <= {0, 1}
    assert abs(quantised.mean() - 0.3) < 0.01
    assert np.all(Quantiser(1.0, 2**20).quantise(value) == 0)  # nearest rounds it away


def test_refuses_non_finite_values_and_bad_declarations() -> None:
    q = Quantiser(1.0, 10)
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError):
            q.quantise(np.array([0.0, bad]))
    with pytest.raises(ValueError):
        q.dequantise_sum(np.zeros(3, np.uint32), 11)
    for clip, count in ((0.0, 1), (-1.0, 1), (float("inf"), 1), (1.0, 0)):
        with pytest.raises(ValueError):
            Quantiser(clip, count)
