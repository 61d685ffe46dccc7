"""Federated evaluation: agents' held-out metrics, robust to what one agent claims.

Each agent reports its accuracy and loss on its own held-out data and how many samples that was;
both are self-reported. The mean weights each agent by its evaluation sample count, but never by
more than ``cap_multiple`` times the median count of the round's reporting agents, so one agent
claiming a million samples moves it by its bounded share only; the median across agents and the
spread (lowest, highest) stand beside it, and a liar shows as an outlier there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.messages import Update

DEFAULT_CAP_MULTIPLE = 2.0
LOSS_CAP_MULTIPLE = 10.0


@dataclass(frozen=True)
class FederatedMetrics:
    accuracy: float | None
    """Mean over agents, weighted by their (bounded) evaluation sample counts."""
    loss: float | None
    samples: int
    """Evaluation samples counted (after the bound)."""
    train_loss: float | None
    accuracy_median: float | None = None
    accuracy_min: float | None = None
    accuracy_max: float | None = None


def federated_metrics(updates: Iterable[Update], cap_multiple: float = DEFAULT_CAP_MULTIPLE) -> FederatedMetrics:
    """sum(w_i * metric_i) / sum(w_i), w_i = min(n_i, ceil(cap_multiple * median n)), over updates that carry
    a held-out evaluation (``cap_multiple`` 0 counts as the default: a count is never taken as reported).

    Accuracy lies in [0, 1]; a loss has no upper end, so each agent's counts for at most LOSS_CAP_MULTIPLE times
    the median agent's: one agent moves the mean loss by a bounded share, as it moves the accuracy."""
    updates = list(updates)
    evaluated = [u.metrics for u in updates if u.metrics.eval_accuracy is not None and u.metrics.eval_loss is not None
                 and u.metrics.num_eval_samples > 0]
    train = [u for u in updates if u.metrics.train_loss is not None and u.num_samples > 0]
    counts = [m.num_eval_samples for m in evaluated]
    # The low median: of two agents, the smaller claim sets the cap (the larger one would cap nothing).
    cap = math.ceil((cap_multiple or DEFAULT_CAP_MULTIPLE) * statistics.median_low(counts)) if counts else 0
    weights = [min(n, cap) for n in counts]
    accuracies = [m.eval_accuracy for m in evaluated if m.eval_accuracy is not None]
    losses = _bounded([m.eval_loss for m in evaluated if m.eval_loss is not None])
    train_losses = _bounded([u.metrics.train_loss for u in train if u.metrics.train_loss is not None])
    return FederatedMetrics(
        accuracy=_mean(accuracies, weights),
        loss=_mean(losses, weights),
        samples=sum(weights),
        train_loss=_mean(train_losses, [u.num_samples for u in train]),
        accuracy_median=statistics.median(accuracies) if accuracies else None,
        accuracy_min=min(accuracies) if accuracies else None,
        accuracy_max=max(accuracies) if accuracies else None,
    )


def _bounded(losses: list[float]) -> list[float]:
    """Each loss at most LOSS_CAP_MULTIPLE times the low median of the positive ones: a zero (one agent's lie, or
    agents that fit their data) must not cap the others at zero and hide a diverging one."""
    positive = [loss for loss in losses if loss > 0]
    if not positive:
        return losses
    bound = LOSS_CAP_MULTIPLE * statistics.median_low(positive)
    return [min(loss, bound) for loss in losses]


def _mean(values: list[float], weights: list[int]) -> float | None:
    """The weighted mean, or None with no weight or where it does not come out finite (losses near the float limit
    from most agents): a summary and a gauge carry a number or nothing."""
    total = sum(weights)
    if not total:
        return None
    mean = math.fsum(w * v for w, v in zip(weights, values, strict=True)) / total
    return mean if math.isfinite(mean) else None


def metrics_by_family(updates: Iterable[Update], cap_multiple: float = DEFAULT_CAP_MULTIPLE) -> dict[str, FederatedMetrics]:
    groups: dict[str, list[Update]] = {}
    for update in updates:
        groups.setdefault(update.family, []).append(update)
    return {family: federated_metrics(group, cap_multiple) for family, group in sorted(groups.items())}
