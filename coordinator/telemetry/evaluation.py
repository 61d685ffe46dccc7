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
    a held-out evaluation (``cap_multiple`` 0: the counts as reported)."""
    updates = list(updates)
    evaluated = [u.metrics for u in updates if u.metrics.eval_accuracy is not None and u.metrics.eval_loss is not None
                 and u.metrics.num_eval_samples > 0]
    train = [u for u in updates if u.metrics.train_loss is not None and u.num_samples > 0]
    counts = [m.num_eval_samples for m in evaluated]
    cap = math.ceil(cap_multiple * statistics.median(counts)) if counts and cap_multiple > 0 else None
    weights = [min(n, cap) if cap is not None else n for n in counts]
    total = sum(weights)
    accuracies = [m.eval_accuracy for m in evaluated if m.eval_accuracy is not None]
    train_n = sum(u.num_samples for u in train)
    return FederatedMetrics(
        accuracy=sum(w * m.eval_accuracy for w, m in zip(weights, evaluated, strict=True)  # type: ignore[operator]
                     ) / total if total else None,
        loss=sum(w * m.eval_loss for w, m in zip(weights, evaluated, strict=True)  # type: ignore[operator]
                 ) / total if total else None,
        samples=total,
        train_loss=sum(u.metrics.train_loss * u.num_samples for u in train) / train_n  # type: ignore[operator]
        if train_n else None,
        accuracy_median=statistics.median(accuracies) if accuracies else None,
        accuracy_min=min(accuracies) if accuracies else None,
        accuracy_max=max(accuracies) if accuracies else None,
    )


def metrics_by_family(updates: Iterable[Update], cap_multiple: float = DEFAULT_CAP_MULTIPLE) -> dict[str, FederatedMetrics]:
    groups: dict[str, list[Update]] = {}
    for update in updates:
        groups.setdefault(update.family, []).append(update)
    return {family: federated_metrics(group, cap_multiple) for family, group in sorted(groups.items())}
