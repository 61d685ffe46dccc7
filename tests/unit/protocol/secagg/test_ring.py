"""The masked input's ring Z_2^b (protocol/secagg/ring.py): packing round-trips, sums are exact modulo
2^b, the low b bits of a masked sum are the sum, and a grid that could wrap is refused."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.secagg import ring
from protocol.secagg.prg import add_mask
from protocol.secagg.quantise import Quantiser


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(2, 32), count=st.integers(1, 200), seed=st.integers(0, 2**32))
def test_pack_keeps_the_low_bits_and_unpacks_them(bits: int, count: int, seed: int) -> None:
    values = np.random.default_rng(seed).integers(0, 2**32, count, dtype=np.uint32)
    packed = ring.pack(values, bits)
    assert packed.dtype == np.uint32 and packed.size == ring.words(count, bits) == -(-count * bits // 32)
    np.testing.assert_array_equal(ring.unpack(packed, bits, count), values & np.uint32((1 << bits) - 1))


def bit_stream_reference(values: np.ndarray, bits: int) -> np.ndarray:
    """The wire form as docs/protocol.md states it, one bit at a time: element i's bit j is bit i * bits + j of the
    little-endian stream of uint32 words."""
    out = [0] * ring.words(values.size, bits)
    for i, value in enumerate(values.tolist()):
        for j in range(bits):
            if value >> j & 1:
                position = i * bits + j
                out[position // 32] |= 1 << position % 32
    return np.array(out, dtype=np.uint32)


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(2, 31), count=st.integers(1, 300), seed=st.integers(0, 2**32))
def test_pack_writes_the_documented_bit_stream_across_its_blocks(bits: int, count: int, seed: int) -> None:
    values = np.random.default_rng(seed).integers(0, 2**32, count, dtype=np.uint32)
    block = ring.UNPACK_BLOCK
    try:
        ring.UNPACK_BLOCK = 64  # several blocks in a small input: the block seams must not show
        packed = ring.pack(values, bits)
    finally:
        ring.UNPACK_BLOCK = block
    np.testing.assert_array_equal(packed, bit_stream_reference(values, bits))


def test_unpack_refuses_a_wrong_length_or_dtype() -> None:
    packed = ring.pack(np.arange(10, dtype=np.uint32), 12)
    for bad in (packed[:-1], packed.astype(np.int64), np.zeros(10, np.uint32)):
        with pytest.raises(ValueError):
            ring.unpack(bad, 12, 10)


@pytest.mark.parametrize("levels, agents, bits", [(127, 10, 12), (127, 100, 15), (127, 258, 16), (127, 259, 17),
                                                  (127, 500, 17), (2047, 10, 16), (2047, 100, 19),
                                                  (2047, 10_000, 26)])
def test_ring_bits_hold_the_extreme_sum(levels: int, agents: int, bits: int) -> None:
    assert ring.ring_bits(levels, agents) == bits
    half = (1 << (bits - 1)) - 1
    assert levels * agents <= half and levels * agents > (half - 1) // 2  # one bit fewer would wrap


@settings(max_examples=40, deadline=None)
@given(levels=st.sampled_from([127, 2047]), count=st.integers(2, 120), seed=st.integers(0, 2**32),
       extreme=st.booleans())
def test_masked_low_bits_sum_exactly_modulo_the_ring(levels: int, count: int, seed: int, extreme: bool) -> None:
    """What the coordinator does: sum the agents' low b bits of x + masks, remove the masks in Z_2^32,
    read the low b bits: the exact integer sum of the quantised values, even at the clip for all."""
    bits = ring.ring_bits(levels, count)
    q = Quantiser(1.0, count, stochastic=True, ring_bits=bits, levels=levels)
    rng = np.random.default_rng(seed)
    values = np.full((count, 64), -1.0 if seed % 2 else 1.0) if extreme else rng.uniform(-1.2, 1.2, (count, 64))
    seeds = [os.urandom(32) for _ in range(count)]
    total = np.zeros(64, dtype=np.uint32)
    integers = np.zeros(64, dtype=np.int64)
    for row, seed_bytes in zip(values, seeds, strict=True):
        quantised = q.quantise(row, rng)
        integers += quantised.view(np.int32)
        masked = quantised.copy()
        add_mask(masked, seed_bytes, +1)
        total += ring.unpack(ring.pack(masked, bits), bits, 64)  # only the low bits travel
    for seed_bytes in seeds:
        add_mask(total, seed_bytes, -1)
    np.testing.assert_array_equal(ring.signed(total, bits), integers)
    assert np.all(np.abs(q.dequantise_sum(total, count) - np.clip(values, -1, 1).sum(axis=0)) <= count * q.step)


def test_a_grid_the_ring_cannot_hold_is_refused() -> None:
    Quantiser(1.0, 100, ring_bits=15, levels=127)  # 12,700 <= 16,383
    with pytest.raises(ValueError, match="wrap"):
        Quantiser(1.0, 100, ring_bits=14, levels=127)  # 12,700 > 8,191
    with pytest.raises(ValueError, match="wrap"):
        Quantiser(1.0, 2**16, ring_bits=16)  # the finest grid of a 16-bit ring has no level left for 65,536
    assert Quantiser(2.0, 10, ring_bits=12, levels=127).step == pytest.approx(2.0 / 127)
