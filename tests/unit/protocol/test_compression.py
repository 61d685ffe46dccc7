"""Codecs for compressed updates (protocol/compression/packing.py): spec parsing, round trips, int8
unbiasedness and error bound, top-k selection, error feedback. Deterministic seeds throughout."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.compression import (
    CompressionSpec,
    ErrorFeedback,
    pack,
    pack_arrays,
    packed_bytes,
    raw_bytes,
    split_compressible,
    unpack,
    unpack_arrays,
)

FAST = settings(deadline=None, max_examples=80)


@st.composite
def float_arrays(draw: st.DrawFn, bound: float = 1e6, subnormal: bool = False) -> np.ndarray:
    """float32/float64 arrays in either byte order, sometimes not C-contiguous, entries within +-bound."""
    dtype = np.dtype(draw(st.sampled_from(["<f4", "<f8", ">f4", ">f8"])))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6))
    bound = float(dtype.type(bound))
    elements = st.floats(-bound, bound, allow_nan=False, allow_subnormal=subnormal, width=dtype.itemsize * 8)
    array = draw(hnp.arrays(dtype, shape, elements=elements))
    return array.T if draw(st.booleans()) else array


@pytest.mark.parametrize("text", ["none", "fp16", "int8", "topk:0.01", "topk:1.0", "topk:0.25"])
def test_spec_text_round_trips(text: str) -> None:
    spec = CompressionSpec.parse(text)
    assert str(spec) == text and CompressionSpec.parse(str(spec)) == spec


def test_spec_parses_fraction_forms() -> None:
    assert CompressionSpec.parse(" topk:1e-3 ") == CompressionSpec("topk", 0.001)
    assert str(CompressionSpec.parse("topk:1")) == "topk:1.0"
    assert str(CompressionSpec("topk", 1)) == "topk:1.0" and isinstance(CompressionSpec("topk", 1).fraction, float)


@pytest.mark.parametrize(("text", "problem"), [
    ("", "unknown compression"), ("gzip", "unknown compression"), ("TOPK:0.1", "unknown compression"),
    ("topk", "needs a fraction"), ("topk:", "needs a fraction"), ("topk:abc", "not a number"),
    ("topk:0", r"\(0, 1\]"), ("topk:-0.5", r"\(0, 1\]"), ("topk:1.01", r"\(0, 1\]"),
    ("topk:nan", r"\(0, 1\]"), ("topk:inf", r"\(0, 1\]"), ("fp16:2", "takes no argument"),
    ("int8:", "takes no argument"), ("topk:" + "1" * 80, "expected none"),
])
def test_spec_errors_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        CompressionSpec.parse(text)


@pytest.mark.parametrize(("kind", "fraction"), [("topk", None), ("topk", 0.0), ("topk", True), ("fp16", 0.5),
                                                ("zstd", None)])
def test_spec_constructor_validates(kind: str, fraction: float | None) -> None:
    with pytest.raises(ValueError):
        CompressionSpec(kind, fraction)  # type: ignore[arg-type]


def test_topk_keeps_ceil_of_the_fraction_as_written() -> None:
    spec = CompressionSpec.parse("topk:0.7")  # 0.7 * 10 is 7.000000000000001 in floats
    assert spec.kept(10) == 7 and spec.kept(11) == 8 and spec.kept(0) == 0
    assert CompressionSpec.parse("topk:1e-9").kept(5) == 1 and CompressionSpec.parse("topk:1").kept(5) == 5


@FAST
@given(array=float_arrays(), kind=st.sampled_from(["fp16", "int8", "topk:0.3", "topk:1"]), seed=st.integers(0, 99))
def test_round_trip_restores_shape_and_dtype(array: np.ndarray, kind: str, seed: int) -> None:
    packed = pack(array, kind, np.random.default_rng(seed))
    restored = unpack(packed)
    assert restored.shape == array.shape and restored.dtype == array.dtype.newbyteorder("<")
    assert restored.flags.writeable
    if kind == "fp16":  # within half a float16 step (relative 2**-11) or the smallest subnormal; saturated past 65504
        close = np.abs(restored - array) <= np.abs(array) * 2.0**-11 + 2.0**-25
        assert np.all(np.where(np.abs(array) > 65504, restored == np.sign(array) * 65504, close))
    elif kind == "topk:1":  # values travel as float32 (float64 ones below its range become 0 or subnormal)
        np.testing.assert_allclose(restored, array, rtol=2.0**-24, atol=1e-37)


@FAST
@given(array=float_arrays(bound=3e38, subnormal=True), seed=st.integers(0, 2**32 - 1))
def test_int8_error_is_within_one_scale_step(array: np.ndarray, seed: int) -> None:
    packed = pack(array, "int8", np.random.default_rng(seed))
    assert packed.scale is not None and packed.values.dtype == np.int8
    peak = float(np.abs(array).max()) if array.size else 0.0
    # max|x| / 127 in the array's dtype, at least its smallest normal number (none of subnormals' lost precision)
    expected = max(peak / 127, float(np.finfo(array.dtype).tiny)) if peak else 1.0
    assert packed.scale == pytest.approx(expected, rel=2.0**-23)
    error = np.abs(unpack(packed).astype(np.float64) - array.astype(np.float64))
    assert np.all(error <= packed.scale * (1 + 1e-4))  # rounding of x / scale and of q * scale in float32


def test_fp16_saturates_instead_of_overflowing() -> None:
    restored = unpack(pack(np.array([1e6, -1e9, 65504.0, 3.0], dtype=np.float32), "fp16"))
    assert restored.tolist() == [65504.0, -65504.0, 65504.0, 3.0]


def test_int8_stochastic_rounding_is_unbiased() -> None:
    rng = np.random.default_rng(7)
    x = rng.uniform(-1.0, 1.0, 64)
    x[0] = 1.0  # fixes the scale at 1/127
    samples = 4000
    mean = np.mean([unpack(pack(x, "int8", rng)) for _ in range(samples)], axis=0)
    scale = 1.0 / 127
    # Each decoding is scale * (floor(y) + Bernoulli(frac)): std <= scale / 2, so the mean's std is at most
    # scale / (2 sqrt(samples)). Six of those: a miss on any of 64 entries has probability ~1e-7.
    tolerance = 6 * scale / (2 * math.sqrt(samples))
    np.testing.assert_array_less(np.abs(mean - x), tolerance)
    nearest = np.round(x / scale) * scale  # deterministic rounding is biased by more than that
    assert np.abs(nearest - x).max() > tolerance


@FAST
@given(n=st.integers(1, 300), fraction=st.floats(0.001, 1.0), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_topk_keeps_exactly_the_k_largest(n: int, fraction: float, seed: int, dtype: type) -> None:
    rng = np.random.default_rng(seed)
    x = ((rng.permutation(n) + 1.0) * rng.choice([-1.0, 1.0], n)).astype(dtype)  # distinct magnitudes
    spec = CompressionSpec("topk", fraction)
    packed = pack(x, spec)
    k = spec.kept(n)
    assert max(1.0, fraction * n - 1e-9) <= k < fraction * n + 1  # ceil(fraction * n), at least one
    assert packed.indices is not None and len(packed.indices) == k
    assert packed.values.dtype == np.float32 and packed.indices.dtype == np.uint32
    assert set(packed.indices.tolist()) == set(np.argsort(np.abs(x))[n - k:].tolist())
    assert np.all(np.diff(packed.indices.astype(np.int64)) > 0)
    restored = unpack(packed)
    np.testing.assert_array_equal(restored[packed.indices], x[packed.indices])
    assert np.count_nonzero(restored) == k


def test_pack_arrays_refuses_what_is_not_compressible() -> None:
    arrays = {"w": np.ones((2, 3), np.float32), "steps": np.array(5, np.int64), "h": np.ones(2, np.float16)}
    floats, others = split_compressible(arrays)
    assert list(floats) == ["w"] and list(others) == ["steps", "h"]
    with pytest.raises(ValueError, match="steps: int64 arrays are not compressible"):
        pack_arrays(arrays, "int8")
    with pytest.raises(ValueError, match="packs nothing"):
        pack_arrays(floats, "none")
    with pytest.raises(ValueError, match="NaN or Inf"):
        pack(np.array([1.0, np.nan]), "fp16")
    packed = pack_arrays(floats, CompressionSpec.parse("int8"), np.random.default_rng(0))
    assert unpack_arrays(packed)["w"].shape == (2, 3)
    assert raw_bytes(floats) == 24 and packed_bytes(packed) == 6 + 8


def test_error_feedback_sends_the_dropped_mass_later() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1000).astype(np.float32)
    spec, rounds = CompressionSpec.parse("topk:0.01"), 800
    feedback = ErrorFeedback()
    sent_total = np.zeros(x.size)
    norms = []
    for _ in range(rounds):
        sent_total += unpack_arrays(feedback.pack({"x": x}, spec))["x"]
        norms.append(feedback.residual_norm())
    true_total = rounds * x.astype(np.float64)
    gap = np.linalg.norm(sent_total - true_total)
    assert gap == pytest.approx(norms[-1], rel=1e-3)  # sent + residual = everything so far
    # Top-k is delta-contractive with delta = k/n: ||r|| <= sqrt(1-delta) / (1 - sqrt(1-delta)) ||x||.
    contraction = math.sqrt(1 - 10 / 1000)
    assert max(norms) <= contraction / (1 - contraction) * np.linalg.norm(x) * (1 + 1e-5)
    assert max(norms[rounds // 2:]) <= 1.1 * max(norms[:rounds // 2])  # bounded, not growing
    assert gap / np.linalg.norm(true_total) < 0.06  # so the relative gap shrinks like 1 / rounds
    # Without it the same few coordinates go out every round: the gap grows with the rounds.
    no_feedback = rounds * unpack(pack(x, spec)).astype(np.float64)
    assert np.linalg.norm(no_feedback - true_total) / np.linalg.norm(true_total) > 0.9


def test_error_feedback_state_round_trips_and_is_validated() -> None:
    feedback = ErrorFeedback()
    arrays = {"w": np.arange(8, dtype=np.float32).reshape(2, 4), "b": np.ones(3)}
    feedback.pack(arrays, "topk:0.25")
    state = feedback.state_dict()
    layout = {"w": ((2, 4), "<f4"), "b": ((3,), "<f8")}
    restored = ErrorFeedback()
    restored.load_state_dict(state, layout)
    assert restored.residual_norm() == feedback.residual_norm() > 0
    bad_states = [
        {"w": np.array([np.nan, 0, 0, 0, 0, 0, 0, 0], np.float32).reshape(2, 4)},
        {"w": np.zeros((2, 4), np.int32)}, {"w": np.zeros((4, 2), np.float32)}, {"w": np.zeros((2, 4))},
        {"other": np.zeros(3)}, {"w": [0.0] * 8},
    ]
    for bad in bad_states:
        with pytest.raises(ValueError):
            restored.load_state_dict(bad, layout)  # type: ignore[arg-type]
    assert restored.residual_norm() == feedback.residual_norm()  # a refused state changes nothing
    with pytest.raises(ValueError, match="reset"):
        restored.compensate({"w": np.zeros(8, np.float32)})
    restored.reset()
    assert restored.residual_norm() == 0.0 and restored.compensate(arrays)["w"] is arrays["w"]


def test_half_precision_states_round_saturate_and_widen_back() -> None:
    from protocol.compression import half_precision, widen_half

    arrays = {"w": np.array([1 / 3, 1e6, -1e6], np.float32), "steps": np.array(7, np.int64),
              "h": np.array([0.5], np.float16)}
    half = half_precision(arrays)
    assert list(half) == ["w", "steps", "h"]  # order kept: digests depend on it
    np.testing.assert_array_equal(half["w"], np.array([np.float16(1 / 3), 65504, -65504], np.float16))
    assert half["steps"] is arrays["steps"] and half["h"] is arrays["h"]
    layout = {"w": ((3,), "<f4"), "steps": ((), "<i8"), "h": ((1,), "<f2")}
    widened = widen_half(half, layout)
    assert widened["w"].dtype == np.float32 and widened["h"].dtype == np.float16
    np.testing.assert_array_equal(widened["w"], half["w"].astype(np.float32))
    assert widen_half({"steps": np.array(1, np.float16)}, layout)["steps"].dtype == np.float16  # left to the check


@FAST
@given(sizes=st.lists(st.integers(0, 60), min_size=2, max_size=5), fraction=st.floats(0.001, 1.0),
       seed=st.integers(0, 2**32 - 1))
def test_topk_over_several_arrays_keeps_the_k_largest_of_all(sizes: list[int], fraction: float, seed: int) -> None:
    """pack_arrays selects top-k model-wide: a small layer with large changes is not starved."""
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    magnitudes = rng.permutation(total) + 1.0  # distinct
    flat = (magnitudes * rng.choice([-1.0, 1.0], total)).astype(np.float32)
    arrays = {f"a{i}": part for i, part in enumerate(np.split(flat, np.cumsum(sizes)[:-1]))}
    spec = CompressionSpec("topk", fraction)
    packed = pack_arrays(arrays, spec)
    restored = np.concatenate([unpack(packed[name]).reshape(-1) for name in arrays])
    k = spec.kept(total)
    assert int(np.count_nonzero(restored)) == k
    assert set(np.flatnonzero(restored).tolist()) == set(np.argsort(np.abs(flat))[total - k:].tolist())
    np.testing.assert_array_equal(restored[restored != 0], flat[restored != 0])
    assert [p.shape for p in packed.values()] == [[s] for s in sizes]
