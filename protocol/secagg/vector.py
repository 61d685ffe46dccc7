"""What an agent masks in a secure round, and how the coordinator reads the unmasked sum back.

The vector is the family's floating arrays in sorted name order, each value clipped to [-clip, clip],
then, under SCAFFOLD (the round declares ``control_clip``), the control-variate delta's floating arrays
in sorted name order, each clipped to [-control_clip, control_clip] and scaled by clip / control_clip
(so one grid holds both, the control values at a step control_clip / clip times the delta's), all
multiplied by the agent's weight w = min(samples, weight_cap) / weight_cap (in [0, 1]), then one last
element w * clip. Quantised with ``Quantiser(clip, len(roster), ring_bits, levels)`` (the round's grid:
the finest, or int8's or fp16's, ``protocol.secagg.ring``) the ring sum of every survivor reads back
exactly as the integer sum, so the coordinator gets sum(w_i x_i) (and sum(w_i dc_i)) and sum(w_i),
divides, and never sees one agent's values. The masked input travels as its low ``ring_bits`` bits
(``pack_masked``). Integer arrays (counters) are not averaged: their delta is 0. Under distributed DP
(``setup.noise``) the delta is first scaled to L2 norm at most ``clip_norm``, and after weighing every value but
the weight gets noise of standard deviation ``noise.agent_std``: Gaussian before quantising, or Skellam (integer)
after rounding to the grid, ``noise.mechanism``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import numpy as np

from protocol.secagg import ring
from protocol.secagg.quantise import Quantiser
from protocol.secagg.wire import SecureFamily, SecureSetup


def float_names(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The floating arrays that are masked, in the order they are laid out."""
    return sorted(name for name, a in arrays.items() if np.asarray(a).dtype.kind == "f")


def vector_length(arrays: Mapping[str, np.ndarray], control: Mapping[str, np.ndarray] | None = None) -> int:
    """Ring elements of one masked input: ``arrays``' floating values, ``control``'s (SCAFFOLD), the weight."""
    return sum(int(np.asarray(a[n]).size) for a in (arrays, control or {}) for n in float_names(a)) + 1


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


def _control_scale(setup: SecureSetup, control: bool) -> float:
    """What a control value is multiplied by to share the delta's grid (its range [-control_clip, control_clip]
    onto [-clip, clip]); ValueError when the round masks control deltas and the caller has none, or the reverse."""
    if control != (setup.control_clip is not None):
        raise ValueError("the round masks a control delta beside the delta" if setup.control_clip is not None
                         else "the round declares no control_clip: it masks no control delta")
    return setup.clip / setup.control_clip if setup.control_clip is not None else 1.0


def encode_input(delta: Mapping[str, np.ndarray], setup: SecureSetup, family: SecureFamily, samples: int,
                 control: Mapping[str, np.ndarray] | None = None,
                 rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the float64 vector before quantising, its uint32 ring form) of one agent's delta, and of its control
    delta when the round masks one (``setup.control_clip`` set: SCAFFOLD). Under ``setup.noise`` (distributed DP)
    the delta's L2 norm is bounded first and the weighted values get this agent's share of the noise, drawn
    from ``rng`` (default: seeded from the OS's random source)."""
    scale = _control_scale(setup, control is not None)
    weight = agent_weight(samples, family.weight_cap)
    if setup.noise is not None and control is not None:
        raise ValueError("the round adds noise to the delta only: it cannot mask a control delta beside it")
    # One float64 buffer, filled and worked on in place: each fresh temporary of a large update costs its pages.
    delta_arrays = [np.asarray(delta[n]).reshape(-1) for n in float_names(delta)]
    arrays = delta_arrays + [np.asarray(control[n]).reshape(-1) for n in float_names(control or {})]
    size = sum(a.size for a in arrays) + 1
    if size != family.n_params:
        raise ValueError(f"the update has {size - 1} floating values, the round declares {family.n_params - 1}")
    plain = np.empty(size, dtype=np.float64)
    segments, offset = [], 0
    for array in arrays:
        segment = plain[offset:offset + array.size]
        segment[:] = array
        segments.append(segment)
        offset += array.size
    values = segments[:len(delta_arrays)]
    if setup.noise is not None:
        norm = float(np.sqrt(sum(float(np.dot(v, v)) for v in values)))
        if norm > setup.noise.clip_norm:
            for v in values:
                v *= setup.noise.clip_norm / norm
    for v in values:
        np.clip(v, -setup.clip, setup.clip, out=v)
    bound = setup.clip / scale  # control_clip under SCAFFOLD
    for v in segments[len(values):]:
        np.clip(v, -bound, bound, out=v)
        v *= scale
    plain[-1] = setup.clip
    plain *= weight
    grid = quantiser(setup, family)
    if setup.noise is None:
        return plain, grid.quantise(plain)
    # Not on the weight: sample counts are public (statuses), the sum of weights too.
    noise_rng = rng if rng is not None else np.random.default_rng(secrets.randbits(128))
    if setup.noise.mechanism == "gaussian":
        plain[:-1] += noise_rng.normal(0.0, setup.noise.agent_std, plain.size - 1)
        return plain, grid.quantise(plain)
    steps = np.zeros(plain.size)
    steps[:-1] = skellam(noise_rng, (setup.noise.agent_std * grid.scale) ** 2, plain.size - 1)
    return plain + steps / grid.scale, grid.quantise(plain, integer_noise=steps)


def skellam(rng: np.random.Generator, variance: float, size: int) -> np.ndarray:
    """``size`` draws of symmetric Skellam noise of ``variance`` (Poisson(variance / 2) - Poisson(variance / 2)),
    as float64 (exact integers): sums of independent Skellam draws are Skellam, as the secure sum needs."""
    half = variance / 2.0
    return (rng.poisson(half, size) - rng.poisson(half, size)).astype(np.float64)


def decode_sum(total: np.ndarray, count: int, like: Mapping[str, np.ndarray], setup: SecureSetup,
               family: SecureFamily, control_like: Mapping[str, np.ndarray] | None = None,
               ) -> tuple[dict[str, dict[str, np.ndarray]], float]:
    """({"delta": float64 weighted sums per floating array of ``like``, and "control_delta": those of
    ``control_like`` when the round masks control deltas}, the total weight) from the unmasked ring sum."""
    scale = _control_scale(setup, control_like is not None)
    values = quantiser(setup, family).dequantise_sum(total, count)
    sums: dict[str, dict[str, np.ndarray]] = {}
    offset = 0
    for payload, arrays, factor in (("delta", like, 1.0), ("control_delta", control_like, 1.0 / scale)):
        if arrays is None:
            continue
        sums[payload] = {}
        for name in float_names(arrays):
            shape = np.asarray(arrays[name]).shape
            size = int(np.prod(shape, dtype=np.int64))
            sums[payload][name] = values[offset:offset + size].reshape(shape) * factor
            offset += size
    if offset + 1 != values.size:
        raise ValueError(f"the sum has {values.size} elements, the layout {offset + 1}")
    return sums, float(values[-1] / setup.clip)
