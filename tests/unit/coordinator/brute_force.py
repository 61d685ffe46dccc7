"""The robust rules written straight from their definitions: Python floats, exact sums, no blocks.

Slow on purpose and shared by the property tests; every function takes the updates of
positive weight only (the rules leave the others out).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

Update = dict[str, np.ndarray]


def positive(updates: list[Update], weights: list[float]) -> list[Update]:
    return [u for u, w in zip(updates, weights, strict=True) if w > 0]


def float_names(update: Update) -> list[str]:
    return [name for name, a in update.items() if a.dtype.kind == "f"]


def vector(update: Update) -> list[float]:
    """All floating values of an update, arrays concatenated in name order."""
    return [float(v) for name in float_names(update) for v in np.asarray(update[name], dtype=np.float64).reshape(-1)]


def clip(updates: list[Update], max_norm: float) -> list[Update]:
    """Each update scaled by min(1, max_norm / ||update||) (floating arrays only), in float64."""
    out = []
    for update in updates:
        norm = math.sqrt(math.fsum(v * v for v in vector(update)))
        scale = 1.0 if norm <= max_norm else max_norm / norm
        out.append({k: (a.astype(np.float64) * scale if a.dtype.kind == "f" else a) for k, a in update.items()})
    return out


def per_coordinate(updates: list[Update], name: str, reduce: Callable[[list[float]], float]) -> np.ndarray:
    shape = updates[0][name].shape
    out = np.empty(shape, dtype=np.float64)
    for index in np.ndindex(*shape):
        out[index] = reduce(sorted(float(u[name][index]) for u in updates))
    return out


def median(values: list[float]) -> float:
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def trimmed(k: int) -> Callable[[list[float]], float]:
    def reduce(values: list[float]) -> float:
        kept = values[k:len(values) - k]
        return math.fsum(kept) / len(kept)
    return reduce


def lower_median_int(updates: list[Update], name: str) -> np.ndarray:
    shape = updates[0][name].shape
    out = np.empty(shape, dtype=updates[0][name].dtype)
    for index in np.ndindex(*shape):
        values = sorted(u[name][index] for u in updates)
        out[index] = values[(len(values) - 1) // 2]
    return out


def squared_distance(a: list[float], b: list[float]) -> float:
    return math.fsum((x - y) ** 2 for x, y in zip(a, b, strict=True))


def krum_scores(updates: list[Update], f: int) -> list[float]:
    """Score of each update: sum of squared distances to its n - f - 2 closest other updates."""
    vectors = [vector(u) for u in updates]
    n = len(vectors)
    scores = []
    for i in range(n):
        distances = sorted(squared_distance(vectors[i], vectors[j]) for j in range(n) if j != i)
        scores.append(math.fsum(distances[:n - f - 2]))
    return scores


def plain_mean(updates: list[Update], name: str) -> np.ndarray:
    shape = updates[0][name].shape
    out = np.empty(shape, dtype=np.float64)
    for index in np.ndindex(*shape):
        out[index] = math.fsum(float(u[name][index]) for u in updates) / len(updates)
    return out
