"""Federated evaluation: agents' held-out metrics, weighted by their evaluation sample counts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protocol.messages import Update


@dataclass(frozen=True)
class FederatedMetrics:
    accuracy: float | None
    loss: float | None
    samples: int
    train_loss: float | None


def federated_metrics(updates: Iterable[Update]) -> FederatedMetrics:
    """sum(n_i * metric_i) / sum(n_i) over updates that carry a held-out evaluation."""
    acc_sum = loss_sum = 0.0
    samples = 0
    train_sum = 0.0
    train_n = 0
    for update in updates:
        m = update.metrics
        if m.eval_accuracy is not None and m.eval_loss is not None and m.num_eval_samples > 0:
            acc_sum += m.eval_accuracy * m.num_eval_samples
            loss_sum += m.eval_loss * m.num_eval_samples
            samples += m.num_eval_samples
        if m.train_loss is not None and update.num_samples > 0:
            train_sum += m.train_loss * update.num_samples
            train_n += update.num_samples
    return FederatedMetrics(
        accuracy=acc_sum / samples if samples else None,
        loss=loss_sum / samples if samples else None,
        samples=samples,
        train_loss=train_sum / train_n if train_n else None,
    )


def metrics_by_family(updates: Iterable[Update]) -> dict[str, FederatedMetrics]:
    groups: dict[str, list[Update]] = {}
    for update in updates:
        groups.setdefault(update.family, []).append(update)
    return {family: federated_metrics(group) for family, group in sorted(groups.items())}
