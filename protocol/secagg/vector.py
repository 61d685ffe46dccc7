"""What an agent masks in a secure FedAvg round, and how the coordinator reads the unmasked sum back.

The vector is the family's floating arrays in sorted name order, each value clipped to [-clip, clip]
and multiplied by the agent's weight w = min(samples, weight_cap) / weight_cap (in [0, 1]), then one
last element w * clip. Quantised with ``Quantiser(clip, len(roster), ring_bits, levels)`` (the
round's grid: the finest, or int8's or fp16's, ``protocol.secagg.ring``) the ring sum of every
survivor reads back exactly as the integer sum, so the coordinator gets sum(w_i x_i) and sum(w_i),
divides, and never sees one agent's values. The masked input travels as its low ``ring_bits`` bits
(``pack_masked``). Integer arrays (counters) are not averaged: their delta is 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from protocol.secagg import ring
from protocol.secagg.quantise import Quantiser
from protocol.secagg.wire import SecureFamily, SecureSetup


def float_names(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The floating arrays that are masked, in the order they are laid out."""
    return sorted(name for name, a in arrays.items() if np.asarray(a).dtype.kind == "f")


def vector_length(arrays: Mapping[str, np.ndarray]) -> int:
    return sum(int(np.asarray(arrays[n]).size) for n in float_names(arrays)) + 1


def quantiser(setup: SecureSetup, family: SecureFamily) -> Quantiser:
    """The round's grid; a coarse one (int8, fp16) rounds stochastically, so that the mean is unbiased."""
    return Quantiser(setup.clip, len(family.roster), stochastic=bool(setup.levels), ring_bits=family.ring_bits,
                     levels=setup.levels)


def pack_masked(masked: np.ndarray, family: SecureFamily) -> np.ndarray:
    """A masked input (uint32[n_params], Z_2^32) -> its wire form: the low ``ring_bits`` bits of each element."""
    return ring.pack(masked, family.ring_bits)


def unpack_masked(words: np.ndarray, family: SecureFamily) -> np.ndarray:
    """The wire form -> uint32[n_params] (each < 2^ring_bits); ValueError for a wrong dtype or length."""
    return ring.unpack(words, family.ring_bits, family.n_params)


def agent_weight(samples: int, weight_cap: int) -> float:
    return min(max(samples, 0), weight_cap) / weight_cap


def encode_input(delta: Mapping[str, np.ndarray], setup: SecureSetup, family: SecureFamily,
                 samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 vector before quantising, its uint32 ring form) of one agent's delta."""
    names = float_names(delta)
    weight = agent_weight(samples, family.weight_cap)
    parts = [np.clip(np.asarray(delta[n], dtype=np.float64).reshape(-1), -setup.clip, setup.clip) for n in names]
    plain = np.concatenate([*parts, np.array([setup.clip], dtype=np.float64)]) * weight
    if plain.size != family.n_params:
        raise ValueError(f"the delta has {plain.size - 1} floating values, the round declares {family.n_params - 1}")
    return plain, quantiser(setup, family).quantise(plain)


def decode_sum(total: np.ndarray, count: int, like: Mapping[str, np.ndarray], setup: SecureSetup,
               family: SecureFamily) -> tuple[dict[str, np.ndarray], float]:
    """(float64 weighted sums per floating array of ``like``, the total weight) from the unmasked ring sum."""
    values = quantiser(setup, family).dequantise_sum(total, count)
    sums: dict[str, np.ndarray] = {}
    offset = 0
    for name in float_names(like):
        shape = np.asarray(like[name]).shape
        size = int(np.prod(shape, dtype=np.int64))
        sums[name] = values[offset:offset + size].reshape(shape)
        offset += size
    if offset + 1 != values.size:
        raise ValueError(f"the sum has {values.size} elements, the layout {offset + 1}")
    return sums, float(values[-1] / setup.clip)
