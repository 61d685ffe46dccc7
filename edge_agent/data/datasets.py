"""A device's samples as plain arrays, and the built-in image sets: scikit-learn's digits, synthetic.

Inputs are float32 [N, ...] (images [N, C, H, W] scaled to [0, 1], sensor windows [N, C, T]);
labels are int64 [N] in the task's declared label space, or float32 targets for regression
(``num_classes == 0``).
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def subset(self, indices: np.ndarray, name: str | None = None) -> Dataset:
        return Dataset(self.x[indices], self.y[indices], self.num_classes, name or self.name)


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle 0..n-1 with ``seed``; return (kept, held_out) with round(fraction * n) held out."""
    order = np.random.default_rng(seed).permutation(n)
    held = int(round(fraction * n))
    return np.sort(order[held:]), np.sort(order[:held])


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, no download): (train, test)."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    train_idx, test_idx = split_indices(len(y), test_fraction, seed)
    full = Dataset(x, y, 10, "digits")
    return full.subset(train_idx, "digits-train"), full.subset(test_idx, "digits-test")


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
