"""Class prototypes of a model's embeddings, and inference by the nearest prototype."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.training import to_tensors


@torch.no_grad()
def embed_all(model: FedModel, data: Dataset, device: torch.device, normalize: bool,
              batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeddings [N, D], logits [N, C]) of every sample, in eval mode; embeddings L2-normalised if asked."""
    model.eval()
    x, _ = to_tensors(data, device)
    embeddings, logits = [], []
    for start in range(0, len(x), batch_size):
        z = model.embed(x[start:start + batch_size])
        logits.append(model.head(z))
        embeddings.append(F.normalize(z, dim=1) if normalize else z)
    if not embeddings:
        dim = model.embedding_dim or 0
        return torch.zeros((0, dim), device=device), torch.zeros((0, data.num_classes), device=device)
    return torch.cat(embeddings), torch.cat(logits)


def class_prototypes(embeddings: torch.Tensor, labels: np.ndarray, num_classes: int,
                     normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per class, the mean embedding of its samples: ([classes, D] float32, counts [classes] int64).

    A class without samples gets a zero row and count 0. With ``normalize`` the embeddings are
    unit vectors already and each mean is scaled back to unit length.
    """
    z = embeddings.detach().cpu().double().numpy()
    counts = np.bincount(labels, minlength=num_classes).astype(np.int64)
    sums = np.zeros((num_classes, z.shape[1]), dtype=np.float64)
    np.add.at(sums, labels, z)
    present = counts > 0
    means = np.zeros_like(sums)
    means[present] = sums[present] / counts[present, None]
    return (unit_rows(means) if normalize else means).astype(np.float32), counts


def unit_rows(prototypes: np.ndarray) -> np.ndarray:
    """Each non-zero row scaled to unit L2 norm; zero rows (classes without samples) stay zero."""
    norms = np.linalg.norm(prototypes, axis=1, keepdims=True)
    return np.divide(prototypes, norms, out=np.zeros_like(prototypes), where=norms > 0)


def nearest_prototype(embeddings: torch.Tensor, prototypes: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """The class of the nearest (Euclidean) prototype among the ``known`` ones, per embedding."""
    distances = torch.cdist(embeddings, prototypes)
    distances[:, ~known] = float("inf")
    return distances.argmin(dim=1)


def prototype_distance(local: np.ndarray, local_counts: np.ndarray, global_: np.ndarray,
                       global_counts: np.ndarray) -> float | None:
    """Mean over this agent's samples of ``||local_c - global_c||`` for their class (classes both know).

    Large values flag an agent whose embedding drifted away from the federation's.
    """
    both = (local_counts > 0) & (global_counts > 0)
    if not both.any():
        return None
    gaps = np.linalg.norm(local[both].astype(np.float64) - global_[both], axis=1)
    return float(np.average(gaps, weights=local_counts[both]))
