"""A device's samples as plain arrays, and the built-in image sets: scikit-learn's digits, synthetic.

Inputs are float32 [N, ...] (images [N, C, H, W] scaled to [0, 1], sensor windows [N, C, T]);
labels are int64 [N] in the task's declared label space, or float32 targets for regression
(``num_classes == 0``).
"""

from __future__ import annotations

import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Dataset:
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str

    def __post_init__(self) -> None:
        if self.x.ndim < 2:
            raise ValueError(f"{self.name}: inputs must be [N, ...], got shape {self.x.shape}")
        if self.y.shape[:1] != (self.x.shape[0],):
            raise ValueError(f"{self.name}: {self.x.shape[0]} inputs but labels of shape {self.y.shape}")
        if self.num_classes:
            if self.y.ndim != 1 or self.y.dtype != np.int64:
                raise ValueError(f"{self.name}: class labels must be int64 [N], got {self.y.dtype}{list(self.y.shape)}")
            if len(self.y) and (self.y.min() < 0 or self.y.max() >= self.num_classes):
                raise ValueError(f"{self.name}: labels must lie in [0, {self.num_classes})")

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return len(self.y)

    def class_counts(self) -> np.ndarray:
        """Samples of each class, int64 [num_classes] (a task without classes: empty)."""
        return np.bincount(self.y, minlength=self.num_classes).astype(np.int64, copy=False) if self.num_classes \
            else np.zeros(0, dtype=np.int64)

    def subset(self, indices: np.ndarray, name: str | None = None) -> Dataset:
        return Dataset(self.x[indices], self.y[indices], self.num_classes, name or self.name)


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle 0..n-1 with ``seed``; return (kept, held_out) with round(fraction * n) held out."""
    order = np.random.default_rng(seed).permutation(n)
    held = int(round(fraction * n))
    return np.sort(order[held:]), np.sort(order[:held])


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download): (train, test)."""
    x, y = _digits_arrays()
    train_idx, test_idx = split_indices(len(y), test_fraction, seed)
    full = Dataset(x, y, 10, "digits")
    return full.subset(train_idx, "digits-train"), full.subset(test_idx, "digits-test")


DIGITS_CSV = ("datasets", "data", "digits.csv.gz")
"""Where scikit-learn keeps the digits inside its package: 64 pixel columns (0-16), then the label."""


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The digits read straight from the CSV scikit-learn ships, without importing scikit-learn.

    ``import sklearn.datasets`` pulls in scipy, pandas and pyarrow (about 80 MB resident on a phone
    profile that trains a 9k-parameter model); locating the package does not execute it.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the digits set is read from scikit-learn's package data: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations)), *DIGITS_CSV)
    if not path.is_file():
        raise ValueError(f"the digits set is read from scikit-learn's package data, and {path} is missing: "
                         f"reinstall scikit-learn")
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    if table.ndim != 2 or table.shape[1] != 65:
        raise ValueError(f"{path}: expected 65 columns (64 pixels and the label), got shape {list(table.shape)}")
    x = np.ascontiguousarray(table[:, :64].reshape(-1, 1, 8, 8) / 16.0)
    return x, table[:, 64].astype(np.int64)


def make_synthetic(n: int = 2000, num_classes: int = 10, shape: tuple[int, int, int] = (1, 8, 8),
                   noise: float = 0.35, seed: int = 0) -> tuple[Dataset, Dataset]:
    """Learnable class-conditional images: a fixed random template per class plus noise."""
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0.0, 1.0, size=(num_classes, *shape)).astype(np.float32)
    y = rng.integers(0, num_classes, size=n).astype(np.int64)
    x = np.clip(templates[y] + noise * rng.standard_normal((n, *shape)).astype(np.float32), 0.0, 1.0)
    full = Dataset(x.astype(np.float32), y, num_classes, "synthetic")
    train_idx, test_idx = split_indices(n, 0.2, seed + 1)
    return full.subset(train_idx, "synthetic-train"), full.subset(test_idx, "synthetic-test")
