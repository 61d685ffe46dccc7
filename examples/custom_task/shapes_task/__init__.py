"""Tell drawn shapes apart: a task an edgefl fleet trains without any change to edgefl itself.

Each device keeps its images in a folder with one sub-folder per class (``circle/``,
``square/``, ...); ``edge-agent run --task shapes --data /path/to/folder`` trains on them.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from edge_agent.data.sources import load_image_folder
from edge_agent.tasks import DataContext, Dataset, FedModel, Task

CLASSES = ("circle", "square", "triangle", "cross")
SIZE = (16, 16)
EMBEDDING = 32


def _block(c_in: int, c_out: int) -> list[nn.Module]:
    # GroupNorm, not BatchNorm: it works with differential privacy (per-sample gradients).
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(4, c_out), nn.ReLU(), nn.MaxPool2d(2)]


def small_cnn() -> FedModel:
    features = nn.Sequential(*_block(1, 8), *_block(8, 16), nn.Flatten(), nn.Linear(16 * 4 * 4, EMBEDDING), nn.ReLU())
    return FedModel.with_linear_head(features, EMBEDDING, len(CLASSES))


def wide_cnn() -> FedModel:
    features = nn.Sequential(*_block(1, 16), *_block(16, 32), nn.Flatten(), nn.Linear(32 * 4 * 4, EMBEDDING), nn.ReLU())
    return FedModel.with_linear_head(features, EMBEDDING, len(CLASSES))


def load(source: str, context: DataContext) -> Dataset:
    data, report = load_image_folder(Path(source), context.classes, size=SIZE, channels=1)
    context.report.merge(report)  # corrupt images are dropped and counted, not fatal
    return data


task = Task(
    name="shapes", version="1.0", classes=CLASSES, embedding_dim=EMBEDDING,
    families={"small_cnn": small_cnn, "wide_cnn": wide_cnn},
    device_families={"jetson": "wide_cnn", "cpu": "wide_cnn"},  # every other device: the first family
    load_data=load, description="drawn circles, squares, triangles and crosses, 16x16",
)
