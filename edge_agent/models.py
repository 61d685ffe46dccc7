"""The model shape every task's family takes, and the image families built-in tasks share.

A ``FedModel`` is a feature extractor ending in an embedding, then a head; families of one task
embed into one dimension, so FedProto prototypes from different families live in one space. A
task's model without an embedding runs whole as the "features" with an identity head.
GroupNorm, not BatchNorm: Opacus needs per-sample gradients and BatchNorm mixes samples within
a batch.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

EMBED_DIM = 64


class FedModel(nn.Module):
    def __init__(self, features: nn.Module, head: nn.Module, *, embedding_dim: int | None, num_outputs: int) -> None:
        super().__init__()
        self.features = features
        self.head = head
        self.embedding_dim = embedding_dim
        """Width of ``embed``'s output; None when the model has no embedding (its head is the identity)."""
        self.num_outputs = num_outputs

    @classmethod
    def with_linear_head(cls, features: nn.Module, embedding_dim: int, num_outputs: int) -> FedModel:
        return cls(features, nn.Linear(embedding_dim, num_outputs), embedding_dim=embedding_dim,
                   num_outputs=num_outputs)

    @classmethod
    def whole(cls, model: nn.Module, num_outputs: int) -> FedModel:
        """A model without an embedding: all of it is the features, the head passes its output on."""
        return cls(model, nn.Identity(), embedding_dim=None, num_outputs=num_outputs)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _conv_block(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.GroupNorm(min(8, c_out // 4), c_out), nn.ReLU()]


def cnn_large(in_shape: tuple[int, ...]) -> nn.Module:
    """~130k parameters on 8x8 input: three conv blocks, for Jetson-class devices."""
    channels = in_shape[0]
    return nn.Sequential(
        *_conv_block(channels, 32), *_conv_block(32, 64), nn.MaxPool2d(2),
        *_conv_block(64, 128), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(128 * 4, EMBED_DIM), nn.ReLU(),
    )


def cnn_small(in_shape: tuple[int, ...]) -> nn.Module:
    """~15k parameters: two narrow conv blocks, for Raspberry Pi-class devices."""
    channels = in_shape[0]
    return nn.Sequential(
        *_conv_block(channels, 16), nn.MaxPool2d(2), *_conv_block(16, 32),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32 * 4, EMBED_DIM), nn.ReLU(),
    )


def mlp_tiny(in_shape: tuple[int, ...]) -> nn.Module:
    """A two-layer perceptron on the flattened input, for phones and microcontrollers."""
    inputs = math.prod(in_shape)
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, EMBED_DIM), nn.ReLU(),
                         nn.Linear(EMBED_DIM, EMBED_DIM), nn.ReLU())


FAMILIES: dict[str, Callable[[tuple[int, ...]], nn.Module]] = {
    "cnn_large": cnn_large,
    "cnn_small": cnn_small,
    "mlp_tiny": mlp_tiny,
}


_GLOBAL_RNG = threading.Lock()
"""Layers initialise from torch's global generator: agents sharing a process (the in-process
launcher) must not seed and draw from it at the same time, or equal seeds give unequal models."""


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Draw from torch's global generator seeded with ``seed``, alone, and restore it afterwards."""
    with _GLOBAL_RNG:
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            yield
        finally:
            torch.random.set_rng_state(generator_state)


def build_model(family: str, in_shape: tuple[int, ...], num_classes: int, seed: int) -> FedModel:
    """An image family with a linear head over ``EMBED_DIM``, weights drawn from ``seed``: equal seeds,
    equal models. Tasks build theirs through ``Task.build_model``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    with seeded(seed):
        return FedModel.with_linear_head(FAMILIES[family](in_shape), EMBED_DIM, num_classes)
