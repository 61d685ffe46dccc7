"""Model families: a feature extractor ending in a shared-dimension embedding, then a head.

Every family embeds into ``EMBED_DIM`` dimensions, so FedProto prototypes from different
families live in one space. GroupNorm, not BatchNorm: Opacus needs per-sample gradients and
BatchNorm mixes samples within a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import nn

EMBED_DIM = 64


class FedModel(nn.Module):
    def __init__(self, features: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.head = nn.Linear(EMBED_DIM, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _conv_block(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(min(8, c_out // 4), c_out), nn.ReLU()]


def cnn_large(in_shape: tuple[int, int, int]) -> nn.Module:
    """~130k parameters on 8x8 input: three conv blocks, for Jetson-class devices."""
    channels = in_shape[0]
    return nn.Sequential(
        *_conv_block(channels, 32), *_conv_block(32, 64), nn.MaxPool2d(2),
        *_conv_block(64, 128), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(128 * 4, EMBED_DIM), nn.ReLU(),
    )


def cnn_small(in_shape: tuple[int, int, int]) -> nn.Module:
    """~15k parameters: two narrow conv blocks, for Raspberry Pi-class devices."""
    channels = in_shape[0]
    return nn.Sequential(
        *_conv_block(channels, 16), nn.MaxPool2d(2), *_conv_block(16, 32),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32 * 4, EMBED_DIM), nn.ReLU(),
    )


def mlp_tiny(in_shape: tuple[int, int, int]) -> nn.Module:
    """A two-layer perceptron on the flattened image, for phones and microcontrollers."""
    inputs = in_shape[0] * in_shape[1] * in_shape[2]
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, EMBED_DIM), nn.ReLU(),
                         nn.Linear(EMBED_DIM, EMBED_DIM), nn.ReLU())


FAMILIES: dict[str, Callable[[tuple[int, int, int]], nn.Module]] = {
    "cnn_large": cnn_large,
    "cnn_small": cnn_small,
    "mlp_tiny": mlp_tiny,
}


_GLOBAL_RNG = threading.Lock()
"""Layers initialise from torch's global generator: agents sharing a process (the in-process
launcher) must not seed and draw from it at the same time, or equal seeds give unequal models."""


def build_model(family: str, in_shape: tuple[int, int, int], num_classes: int, seed: int) -> FedModel:
    """The family's model with weights drawn from ``seed``: equal seeds give equal models."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    with _GLOBAL_RNG:
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            return FedModel(FAMILIES[family](in_shape), num_classes)
        finally:
            torch.random.set_rng_state(generator_state)

