"""An agent's private data: what its task loads from its data source, split into train and held-out parts."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.data.datasets import Dataset, split_indices
from edge_agent.data.partition import format_summary, make_partition, summarize
from edge_agent.data.sources.report import LoadReport

if TYPE_CHECKING:
    from edge_agent.tasks.base import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalData:
    train: Dataset
    held_out: Dataset
    report: LoadReport
    """What loading dropped (corrupt files, bad rows) and warned about."""


def build_local_data(task: Task, data: str | None = None, *, eval_data: str | None = None, partition: str = "none",
                     num_partitions: int = 1, partition_index: int = 0, alpha: float = 0.5, min_size: int = 10,
                     classes_per_client: int = 2, samples_per_class: int | None = None, data_seed: int = 0,
                     eval_fraction: float = 0.15) -> LocalData:
    """Load ``data`` with ``task``'s loader, take this agent's partition, and find its held-out split.

    With ``partition="none"`` all of it is the agent's (a real device with its own data); otherwise
    every agent computes the same seeded partition of the pool and keeps its index (simulation);
    ``samples_per_class`` caps its samples of each class (a few-shot fleet).
    The held-out split is ``eval_data`` when given, else ``eval_fraction`` of the agent's samples.
    """
    from edge_agent.tasks.base import DataContext

    source = data or task.default_data
    if source is None:
        raise ValueError(f"task {task.card.ref} has no built-in data: give this device's data (--data)")
    context = DataContext(classes=tuple(task.classes), seed=data_seed)
    pool = task.load(source, context)
    if partition == "none":
        mine = pool
    else:
        if not pool.num_classes and partition != "iid":
            raise ValueError(f"partition {partition!r} skews labels: task {task.card.ref} has none (use iid)")
        labels = pool.y if pool.num_classes else np.zeros(len(pool), dtype=np.int64)  # iid needs only the count
        parts = make_partition(partition, labels, num_partitions, data_seed, alpha=alpha, min_size=min_size,
                               classes_per_client=classes_per_client, samples_per_class=samples_per_class)
        if pool.num_classes:
            rows = summarize(pool.y, parts, pool.num_classes)
            log.info("label skew of the %s partition (%d clients):\n%s", partition, num_partitions, format_summary(rows))
            row = rows[partition_index]
            log.info("this agent holds partition %d: %d samples, %d classes, KL to global %.3f",
                     partition_index, row.samples, row.classes, row.kl_divergence)
        mine = pool.subset(parts[partition_index], f"{pool.name}[{partition_index}]")
    if eval_data is not None:
        held_out = task.load(eval_data, context)
        if held_out.in_shape != mine.in_shape:
            raise ValueError(f"eval_data {eval_data!r} has inputs of shape {list(held_out.in_shape)}, the training "
                             f"data {list(mine.in_shape)}")
        train = mine
    else:
        train_idx, held_idx = split_indices(len(mine), eval_fraction, seed=data_seed * 7919 + partition_index)
        train, held_out = mine.subset(train_idx), mine.subset(held_idx, f"{mine.name}-held-out")
    if len(train) == 0:
        raise ValueError(f"data {source!r}: no training samples left for this agent")
    if context.report.dropped or context.report.warnings:
        log.warning("data %s: %s", source, context.report.summary())
    classes = len(set(train.y.tolist())) if train.num_classes else 0
    log.info("this agent holds %d training samples%s and %d held-out samples (%s)", len(train),
             f" of {classes} of the task's {train.num_classes} classes" if train.num_classes else "",
             len(held_out), "from " + eval_data if eval_data else f"{eval_fraction:.0%} of its data")
    return LocalData(train, held_out, context.report)
