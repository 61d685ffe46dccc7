"""An agent's private data: its share of a data set, split into train and held-out parts."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from edge_agent.data.datasets import Dataset, load_dataset, split_indices
from edge_agent.data.partition import format_summary, make_partition, summarize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalData:
    train: Dataset
    held_out: Dataset


def build_local_data(data: str, *, partition: str = "none", num_partitions: int = 1, partition_index: int = 0,
                     alpha: float = 0.5, min_size: int = 10, classes_per_client: int = 2, data_seed: int = 0,
                     eval_fraction: float = 0.15) -> LocalData:
    """Load ``data``, take this agent's partition of its training pool, hold out a split.

    With ``partition="none"`` the whole training pool is the agent's (a real device with its
    own data); otherwise every agent computes the same seeded partition and keeps its index.
    """
    pool, _test = load_dataset(data, seed=data_seed)
    if partition == "none":
        mine = pool
        classes = len(set(pool.y.tolist()))
        log.info("this agent holds its whole data set: %d samples, %d classes (no fleet to compare with)",
                 len(pool), classes)
    else:
        parts = make_partition(partition, pool.y, num_partitions, data_seed, alpha=alpha, min_size=min_size,
                               classes_per_client=classes_per_client)
        rows = summarize(pool.y, parts, pool.num_classes)
        log.info("label skew of the %s partition (%d clients):\n%s", partition, num_partitions, format_summary(rows))
        row = rows[partition_index]
        log.info("this agent holds partition %d: %d samples, %d classes, KL to global %.3f",
                 partition_index, row.samples, row.classes, row.kl_divergence)
        mine = pool.subset(parts[partition_index], f"{pool.name}[{partition_index}]")
    train_idx, held_idx = split_indices(len(mine), eval_fraction, seed=data_seed * 7919 + partition_index)
    return LocalData(mine.subset(train_idx), mine.subset(held_idx, f"{mine.name}-held-out"))
