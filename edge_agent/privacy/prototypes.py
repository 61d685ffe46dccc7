"""FedProto under DP: per-class prototypes released through an accounted Gaussian mechanism.

What DP-SGD covers, and what it does not: DP-SGD makes the *weights* (and anything computed
from them alone: deltas, SCAFFOLD control variates) differentially private. FedProto also
sends per-class mean embeddings and per-class counts computed from the raw training
records; DP-SGD says nothing about those. Under ``dp`` an agent therefore releases them only
through this mechanism, and refuses a round that would send them otherwise.

The mechanism: each record's embedding is clipped to L2 norm ``clip``; per class, the sum of
clipped embeddings and ``clip`` times the count are released with Gaussian noise of std
``noise_multiplier * sqrt(2) * clip`` on every coordinate. Adding or removing one record
changes that joint vector by at most ``sqrt(clip**2 + clip**2)``, so this is the Gaussian
mechanism with noise multiplier ``noise_multiplier``, composed into the agent's ledger as one
step at sample rate 1. The prototypes are the noisy sums over the noisy counts, and the
released counts are the noisy counts rounded and floored at 0 (post-processing).
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import torch

from edge_agent.privacy.ledger import Charge


class PrototypeRelease:
    """One round's prototype release; it may be used once, as it is charged once."""

    def __init__(self, noise_multiplier: float, clip: float) -> None:
        if not (noise_multiplier > 0 and clip > 0):
            raise ValueError("the prototype mechanism needs a positive noise multiplier and clip norm")
        self.noise_multiplier = noise_multiplier
        self.clip = clip
        self._used = False

    def charge(self) -> Charge:
        return Charge(self.noise_multiplier, 1.0, 1)

    def release(self, embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int,
                generator: torch.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(prototypes [classes, dim] float32, counts [classes] int64) of ``embeddings`` grouped by ``labels``.

        ``generator`` is for tests only: by default the noise is seeded from the OS's random source.
        """
        if self._used:
            raise RuntimeError("prototypes were already released this round; a second release is not accounted")
        self._used = True
        embeddings = embeddings.detach().to(torch.float64).cpu()
        norms = embeddings.norm(dim=1, keepdim=True)
        clipped = embeddings * (self.clip / (norms + 1e-12)).clamp(max=1.0)
        sums = torch.zeros((num_classes, embeddings.shape[1]), dtype=torch.float64)
        sums.index_add_(0, labels.cpu(), clipped)
        scaled_counts = self.clip * torch.bincount(labels.cpu(), minlength=num_classes).to(torch.float64)
        gen = generator or torch.Generator().manual_seed(secrets.randbits(63))
        std = self.noise_multiplier * math.sqrt(2.0) * self.clip
        noisy_sums = sums + std * torch.randn(sums.shape, generator=gen, dtype=torch.float64)
        noisy_counts = (scaled_counts + std * torch.randn(num_classes, generator=gen, dtype=torch.float64)) / self.clip
        prototypes = noisy_sums / noisy_counts.clamp(min=1.0).unsqueeze(1)
        counts = noisy_counts.round().clamp(min=0).to(torch.int64)
        prototypes[counts == 0] = 0.0  # a class with no (noisy) support carries no prototype
        return prototypes.to(torch.float32).numpy(), counts.numpy()
