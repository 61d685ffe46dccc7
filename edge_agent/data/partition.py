"""Seeded partitioners that simulate a fleet's label skew, and a summary of the skew.

All are pure functions of (labels, arguments, seed): the same inputs always give the same
partition, and every sample goes to exactly one client (at most one, once ``cap_per_class``
limits each client's samples of a class: a few-shot fleet).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def partition_iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    _check_clients(labels, num_clients)
    order = np.random.default_rng(seed).permutation(len(labels))
    return [np.sort(part) for part in np.array_split(order, num_clients)]


def partition_dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int,
                        min_size: int = 10, max_attempts: int = 1000) -> list[np.ndarray]:
    """Per class, split its samples across clients in proportions drawn from Dir(alpha).

    Smaller ``alpha`` means stronger skew. Draws repeat until every client holds at least
    ``min_size`` samples; a ``ValueError`` says so if that cannot be reached.
    """
    _check_clients(labels, num_clients)
    if alpha <= 0:
        raise ValueError("alpha must be positive")
    if min_size * num_clients > len(labels):
        raise ValueError(f"min_size {min_size} x {num_clients} clients exceeds {len(labels)} samples")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_attempts):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
            for client, piece in enumerate(np.split(members, cuts)):
                parts[client].append(piece)
        result = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in result) >= min_size:
            return result
    raise ValueError(f"no Dirichlet(alpha={alpha}) draw gave every client {min_size} samples in {max_attempts} tries")


def partition_classes(labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int) -> list[np.ndarray]:
    """Each client holds ``classes_per_client`` classes; each class's samples are split
    evenly among the clients holding it. Classes are dealt round-robin over a seeded shuffle,
    so every class is held by someone when ``num_clients * classes_per_client >= classes``."""
    _check_clients(labels, num_clients)
    classes = np.unique(labels)
    if not 1 <= classes_per_client <= len(classes):
        raise ValueError(f"classes_per_client must lie in [1, {len(classes)}]")
    if num_clients * classes_per_client < len(classes):
        raise ValueError(f"{num_clients} clients x {classes_per_client} classes cannot cover {len(classes)} classes")
    rng = np.random.default_rng(seed)
    deck = rng.permutation(classes)
    held = [[deck[(i * classes_per_client + j) % len(deck)] for j in range(classes_per_client)]
            for i in range(num_clients)]
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for client, owned in enumerate(held):
        for c in owned:
            if client not in holders[int(c)]:
                holders[int(c)].append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, clients in holders.items():
        members = rng.permutation(np.flatnonzero(labels == c))
        for client, piece in zip(clients, np.array_split(members, len(clients)), strict=True):
            parts[client].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.array([], dtype=np.int64) for p in parts]


def cap_per_class(labels: np.ndarray, parts: list[np.ndarray], samples_per_class: int, seed: int) -> list[np.ndarray]:
    """Each part keeps at most ``samples_per_class`` of each of its classes, a seeded choice; the rest
    are left out (no part gets them), so a part's class mix stays that of its partition."""
    if samples_per_class < 1:
        raise ValueError("samples_per_class must be at least 1")
    rng = np.random.default_rng([seed, samples_per_class])
    capped = []
    for part in parts:
        kept = [rng.permutation(part[labels[part] == c])[:samples_per_class] for c in np.unique(labels[part])]
        capped.append(np.sort(np.concatenate(kept)) if kept else part)
    return capped


def _check_clients(labels: np.ndarray, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError("num_clients must be at least 1")
    if num_clients > len(labels):
        raise ValueError(f"{num_clients} clients for {len(labels)} samples")


@dataclass(frozen=True)
class ClientSummary:
    client: int
    samples: int
    classes: int
    kl_divergence: float
    """KL(client label distribution || global label distribution), in nats."""


def kl_to_global(client_labels: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    q = np.bincount(labels, minlength=num_classes) / len(labels)
    counts = np.bincount(client_labels, minlength=num_classes)
    if counts.sum() == 0:
        return 0.0
    p = counts / counts.sum()
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def summarize(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> list[ClientSummary]:
    return [
        ClientSummary(i, len(p), int(len(np.unique(labels[p]))), kl_to_global(labels[p], labels, num_classes))
        for i, p in enumerate(parts)
    ]


def format_summary(rows: list[ClientSummary]) -> str:
    lines = ["client  samples  classes  KL(client||global)"]
    lines += [f"{r.client:>6}  {r.samples:>7}  {r.classes:>7}  {r.kl_divergence:>18.3f}" for r in rows]
    return "\n".join(lines)


def make_partition(kind: str, labels: np.ndarray, num_clients: int, seed: int, *, alpha: float = 0.5,
                   min_size: int = 10, classes_per_client: int = 2,
                   samples_per_class: int | None = None) -> list[np.ndarray]:
    """``kind``'s partition; with ``samples_per_class``, each client then keeps at most that many
    samples of each class it holds (``cap_per_class``)."""
    if kind == "iid":
        parts = partition_iid(labels, num_clients, seed)
    elif kind == "dirichlet":
        parts = partition_dirichlet(labels, num_clients, alpha, seed, min_size=min_size)
    elif kind == "classes":
        parts = partition_classes(labels, num_clients, classes_per_client, seed)
    else:
        raise ValueError(f"unknown partition {kind!r}; known: iid, dirichlet, classes")
    return parts if samples_per_class is None else cap_per_class(labels, parts, samples_per_class, seed)
