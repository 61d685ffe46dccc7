"""``basic-motions``: a 1-D CNN over windows of smartwatch accelerometer and gyroscope readings.

The data are real: BasicMotions (4 activities, 6 axes at 10 Hz, 40 + 40 recordings of 100
readings), read from the files the ``sktime`` or ``aeon`` package ships. Each recording is cut
into overlapping windows of 50 readings; the train/test split stays by recording, so no window
of a test recording is ever trained on. Sources: ``basic-motions`` / ``basic-motions:test``, an
.npz of windows [N, 6, 50], or CSV/Parquet readings with columns acc_x..gyr_z and ``label``.
"""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.tasks.base import DataContext, Task
from edge_agent.tasks.builtin.sources import load_sensor_source
from protocol.tasks import BUILTIN_CARDS

CARD = BUILTIN_CARDS["basic-motions"]
AXES = ("acc_x", "acc_y", "acc_z", "gyr_x", "gyr_y", "gyr_z")
WINDOW = 50
STRIDE = 10
READING_SCALE = 0.1
"""Readings reach +-35 (m/s^2 and rad/s); a fixed scale, the same on every device, keeps inputs near +-3."""


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def _block(c_in: int, c_out: int, kernel: int) -> list[nn.Module]:
    return [nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2), nn.GroupNorm(min(8, c_out // 4), c_out), nn.ReLU()]


def conv1d_large() -> FedModel:
    features = nn.Sequential(Scale(READING_SCALE), *_block(len(AXES), 32, 5), *_block(32, 64, 5), nn.MaxPool1d(2),
                             *_block(64, 64, 3), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                             nn.Linear(64, CARD.embedding_dim), nn.ReLU())  # type: ignore[arg-type]
    return FedModel.with_linear_head(features, CARD.embedding_dim, CARD.num_classes)  # type: ignore[arg-type]


def conv1d_small() -> FedModel:
    features = nn.Sequential(Scale(READING_SCALE), *_block(len(AXES), 16, 5), nn.MaxPool1d(2), *_block(16, 32, 3),
                             nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, CARD.embedding_dim), nn.ReLU())  # type: ignore[arg-type]
    return FedModel.with_linear_head(features, CARD.embedding_dim, CARD.num_classes)  # type: ignore[arg-type]


def mlp() -> FedModel:
    dim: int = CARD.embedding_dim  # type: ignore[assignment]
    features = nn.Sequential(Scale(READING_SCALE), nn.Flatten(), nn.Linear(len(AXES) * WINDOW, dim), nn.ReLU(),
                             nn.Linear(dim, dim), nn.ReLU())
    return FedModel.with_linear_head(features, dim, CARD.num_classes)


def _load(source: str, context: DataContext) -> Dataset:
    # basic-motions and basic-motions:test come from the basic_motions data source (offered to this task only)
    return load_sensor_source(source, context, builtin={}, columns=AXES, window=WINDOW, stride=STRIDE, task=CARD.name)


task = Task(
    name=CARD.name, version=CARD.version, classes=CARD.classes, embedding_dim=CARD.embedding_dim,
    families={"conv1d_large": conv1d_large, "conv1d_small": conv1d_small, "mlp_tiny": mlp},
    device_families={"jetson": "conv1d_large", "rpi": "conv1d_small", "phone": "mlp_tiny", "cpu": "conv1d_large"},
    load_data=_load, default_data="basic-motions", description=CARD.description,
)
