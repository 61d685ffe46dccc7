"""Speed and memory of the aggregation rules against straightforward references (bench/robust.py).

References, all measured in the same run as ours:
- pairwise distances, two Python double loops over pairs: in float64 like ours (the goal's
  reference), ``d = a - b; d @ d`` on float64 copies of the flattened updates (conversion
  timed: ours converts as well); and in float32 as usually written,
  ``sum(np.sum((a[k] - b[k]) ** 2) for k in a)`` on the arrays as sent (half the bytes,
  float32 sums: faster, less exact);
- coordinate-wise rules: ``np.median(stack, axis=0)`` on the updates stacked beforehand
  (stacking not timed), and with the stacking timed;
- weighted mean: summing the arrays in place, ``acc += update`` (float32, as sent), and the
  same into a float64 accumulator;
- geometric median: RFA's smoothed Weiszfeld written plainly, on the updates stacked into one
  n x d float64 matrix (stacking timed), the distances ``np.linalg.norm(x - z, axis=1)`` each
  iteration, for as many iterations as ours ran.

The memory table covers every rule in the registry, as ``build_aggregator`` configures it.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from timing import median_seconds

from coordinator.aggregation import UpdateStack, coordinate_median, krum, multi_krum, trimmed_mean, weighted_mean
from coordinator.aggregation.aggregator import build_aggregator
from coordinator.aggregation.geometric_median import geometric_median, smoothed_weiszfeld
from coordinator.aggregation.registry import RULES
from coordinator.settings import CoordinatorSettings

KRUM_GOAL = 10.0  # reference / ours, at least
COORDINATE_GOAL = 1.0  # ours / np.median, at most
MEAN_GOAL = 1.5  # ours / in-place sum, at most


def make_updates(n: int, num_params: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` updates shaped like a small CNN's parameters (four float32 arrays), ``num_params`` each."""
    rng = np.random.default_rng(seed)
    conv = num_params * 3 // 10 // 288 * 288
    fc = num_params * 6 // 10 // 1000 * 1000
    shapes = {"features.0.weight": (conv // 288, 32, 3, 3), "classifier.0.weight": (fc // 1000, 1000),
              "classifier.0.bias": (1000,), "head.weight": (num_params - conv - fc - 1000,)}
    return [{name: (0.01 * rng.standard_normal(shape, dtype=np.float32)) for name, shape in shapes.items()}
            for _ in range(n)]


def flat64(updates: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    return [np.concatenate([a.ravel() for a in u.values()]).astype(np.float64) for u in updates]


def plain_double_loop(updates: list[dict[str, np.ndarray]]) -> np.ndarray:
    n = len(updates)
    distances = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            distances[i, j] = distances[j, i] = sum(float(np.sum((updates[i][k] - updates[j][k]) ** 2))
                                                    for k in updates[i])
    return distances


def double_loop_distances(updates: list[dict[str, np.ndarray]]) -> np.ndarray:
    vectors = flat64(updates)
    n = len(vectors)
    distances = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            d = vectors[i] - vectors[j]
            distances[i, j] = distances[j, i] = d @ d
    return distances


def plain_weiszfeld(updates: list[dict[str, np.ndarray]], iterations: int, smoothing: float,
                    tolerance: float) -> np.ndarray:
    """The geometric median as usually written (each update counted once), from the plain mean."""
    x = np.stack(flat64(updates))
    z = x.mean(axis=0)
    distances = np.linalg.norm(x - z, axis=1)
    objective = distances.sum()
    for _ in range(iterations):
        betas = 1.0 / np.maximum(smoothing, distances)
        z = betas @ x / betas.sum()
        distances = np.linalg.norm(x - z, axis=1)  # for the objective and the next step alike
        previous, objective = objective, distances.sum()
        if abs(previous - objective) <= tolerance * objective:
            break
    return z


def sum_in_place(updates: list[dict[str, np.ndarray]], dtype: type) -> dict[str, np.ndarray]:
    acc = {k: v.astype(dtype) for k, v in updates[0].items()}
    for update in updates[1:]:
        for name, value in update.items():
            np.add(acc[name], value, out=acc[name])
    return acc


def peak_bytes(operation: Callable[[], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        operation()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@dataclass
class SpeedReport:
    lines: list[str]
    verdicts: list[tuple[bool, str]]


def run_speed(n: int, num_params: int, repetitions: int, f: int, beta: float) -> SpeedReport:
    updates = make_updates(n, num_params)
    weights = [float(100 + i) for i in range(n)]
    stack = np.stack([np.concatenate([a.ravel() for a in u.values()]) for u in updates])
    # Same answers as the references, checked before timing anything.
    ours_median = coordinate_median(updates, weights)
    assert np.array_equal(np.concatenate([a.ravel() for a in ours_median.values()]), np.median(stack, axis=0))
    defaults = CoordinatorSettings.model_fields  # the geometric median's, as a coordinator runs it
    steps, smoothing = defaults["geomed_iterations"].default, defaults["geomed_smoothing"].default
    converged = smoothed_weiszfeld(UpdateStack(updates, weights), steps, smoothing,
                                   defaults["geomed_tolerance"].default)[1]
    ours_geomed = geometric_median(updates, weights, iterations=steps, tolerance=0.0)
    np.testing.assert_allclose(np.concatenate([a.ravel() for a in ours_geomed.values()]),
                               plain_weiszfeld(updates, steps, smoothing, 0.0), rtol=1e-5, atol=1e-8)
    t = median_seconds({
        "krum": lambda: krum(updates, weights, f=f),
        "multi_krum": lambda: multi_krum(updates, weights, f=f),
        "double_loop": lambda: double_loop_distances(updates),
        "plain_loop": lambda: plain_double_loop(updates),
        "median": lambda: coordinate_median(updates, weights),
        "trimmed_mean": lambda: trimmed_mean(updates, weights, beta=beta),
        "np_median": lambda: np.median(stack, axis=0),
        "np_stack_median": lambda: np.median(np.stack([np.concatenate([a.ravel() for a in u.values()])
                                                       for u in updates]), axis=0),
        "mean": lambda: weighted_mean(updates, weights),
        "sum32": lambda: sum_in_place(updates, np.float32),
        "sum64": lambda: sum_in_place(updates, np.float64),
        "geomed": lambda: geometric_median(updates, weights, iterations=steps, tolerance=0.0),
        "plain_weiszfeld": lambda: plain_weiszfeld(updates, steps, smoothing, 0.0),
    }, repetitions)
    nbytes = n * num_params * 4
    few = updates[:10]
    # Every registered rule as configured, with f = 0 (trimming beta * 10 values per end cannot exclude f = 3;
    # f does not change the memory a rule takes).
    rules = {name: build_aggregator(CoordinatorSettings(aggregator=name, trim_beta=beta)) for name in RULES.names()}
    memory = {name: (peak_bytes(lambda r=rule: r(few, [1.0] * len(few))),
                     peak_bytes(lambda r=rule: r(updates, [1.0] * len(updates))))
              for name, rule in rules.items()}

    def row(name: str, seconds: float, vs: str) -> str:
        return f"{name:<44} {seconds * 1e3:>10.1f} {nbytes / 1e6 / seconds:>9.0f}  {vs}"

    krum_ratio = t["double_loop"] / t["krum"]
    plain_ratio = t["plain_loop"] / t["krum"]
    lines = [
        f"{'operation':<44} {'median ms':>10} {'MB/s':>9}  ratio (time)",
        "-" * 100,
        row("krum (ours, Gram matrix)", t["krum"], f"loop [a1] / ours {plain_ratio:.1f}x  "
                                                   f"loop [a2] / ours {krum_ratio:.1f}x"),
        row("multi_krum (ours)", t["multi_krum"], f"loop [a1] / ours {t['plain_loop'] / t['multi_krum']:.1f}x  "
                                                  f"loop [a2] / ours {t['double_loop'] / t['multi_krum']:.1f}x"),
        row("pairwise distances, double loop, float32 [a1]", t["plain_loop"], ""),
        row("pairwise distances, double loop, float64 [a2]", t["double_loop"], ""),
        row("coordinate_median (ours)", t["median"], f"ours / np.median {t['median'] / t['np_median']:.2f}"),
        row(f"trimmed_mean beta={beta} (ours)", t["trimmed_mean"],
            f"ours / np.median {t['trimmed_mean'] / t['np_median']:.2f}"),
        row("np.median(stack, axis=0) [b]", t["np_median"], ""),
        row("np.median(np.stack(updates), axis=0)", t["np_stack_median"], ""),
        row("weighted_mean (ours, float64 accumulation)", t["mean"],
            f"ours / sum f32 {t['mean'] / t['sum32']:.2f}  ours / sum f64 {t['mean'] / t['sum64']:.2f}"),
        row("sum in place, float32 accumulator [c]", t["sum32"], ""),
        row("sum in place, float64 accumulator [c]", t["sum64"], ""),
        row(f"geometric_median (ours, {steps} steps [e])", t["geomed"],
            f"plain [d] / ours {t['plain_weiszfeld'] / t['geomed']:.1f}x  (default tolerance stops after {converged})"),
        row("plain numpy Weiszfeld, float64 stack [d]", t["plain_weiszfeld"], ""),
        "",
        f"{'peak traced memory (tracemalloc)':<44} {'n=10 MB':>10} {f'n={n} MB':>9}  growth",
        "-" * 100,
    ]
    for name, (small, large) in memory.items():
        lines.append(f"{name:<44} {small / 1e6:>10.1f} {large / 1e6:>9.1f}  {(large - small) / 1e6:+.1f} MB")
    lines.append(f"(output alone: {num_params * 4 / 1e6:.1f} MB; n x d in float64 would be "
                 f"{n * num_params * 8 / 1e6:.0f} MB)")
    mean_growth = memory["mean"][1] - memory["mean"][0]
    verdicts = [
        (krum_ratio >= KRUM_GOAL, (f"Krum at least {KRUM_GOAL:.0f}x faster than the double loop at its precision "
                                  f"(float64) [a2]: {krum_ratio:.1f}x")),
        (plain_ratio >= KRUM_GOAL, (f"(stricter) Krum at least {KRUM_GOAL:.0f}x faster than the float32 double loop "
                                   f"[a1]: {plain_ratio:.1f}x")),
        (t["median"] / t["np_median"] <= COORDINATE_GOAL,
         f"median no slower than np.median on the stack: ours/np.median = {t['median'] / t['np_median']:.2f}"),
        (t["trimmed_mean"] / t["np_median"] <= COORDINATE_GOAL,
         (f"trimmed mean no slower than np.median on the stack: ours/np.median = "
         f"{t['trimmed_mean'] / t['np_median']:.2f}")),
        (t["mean"] / t["sum32"] <= MEAN_GOAL,
         f"weighted mean within {MEAN_GOAL}x of summing the float32 arrays in place: {t['mean'] / t['sum32']:.2f}"),
        (t["mean"] / t["sum64"] <= MEAN_GOAL,
         f"weighted mean within {MEAN_GOAL}x of summing in place into float64: {t['mean'] / t['sum64']:.2f}"),
        (mean_growth <= 1_000_000, (f"weighted mean memory does not grow with n: {mean_growth / 1e6:+.2f} MB "
                                   f"from n=10 to n={n}")),
    ]
    return SpeedReport(lines, verdicts)


FOOTNOTES = [
    "[a1] sum(np.sum((a[k] - b[k]) ** 2) for k in a) for each pair, on the float32 arrays as sent (float32 sums).",
    "[a2] d = a - b; d @ d for each pair, on float64 copies of the flattened updates (conversion timed).",
    "[b] the updates stacked into one n x d float32 array beforehand (stacking not timed); the next line times it.",
    "[c] acc += update per array, acc starting as a copy of the first update (in that dtype): no weights.",
    "[d] smoothed Weiszfeld on the updates stacked into one n x d float64 matrix (stacking timed), "
    "np.linalg.norm(x - z, axis=1) once per step; as many steps as ours, same answer (checked first).",
    "[e] every step geomed_iterations allows (tolerance 0), ours and [d] alike: the worst case; the default "
    "tolerance stops earlier (the ratio column says after how many steps, on these updates).",
    "Memory: peak bytes numpy allocates during one call (tracemalloc), inputs excluded.",
]
