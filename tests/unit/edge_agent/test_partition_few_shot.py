"""A few-shot fleet: ``samples_per_class`` caps each agent's samples of each class it holds."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.config import AgentSettings
from edge_agent.data.local import build_local_data
from edge_agent.data.partition import cap_per_class, make_partition
from edge_agent.tasks.registry import resolve_task


def skewed_labels() -> np.ndarray:
    """10 classes of uneven sizes (class c has 5 + 7c samples), shuffled."""
    labels = np.concatenate([np.full(5 + 7 * c, c) for c in range(10)]).astype(np.int64)
    return np.random.default_rng(1).permutation(labels)


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "classes"])
@pytest.mark.parametrize("cap", [1, 4, 15])
def test_each_part_keeps_at_most_cap_of_each_of_its_classes(kind: str, cap: int) -> None:
    labels = skewed_labels()
    full = make_partition(kind, labels, 6, 3, alpha=0.5, min_size=2, classes_per_client=3)
    capped = make_partition(kind, labels, 6, 3, alpha=0.5, min_size=2, classes_per_client=3, samples_per_class=cap)
    assert len(capped) == len(full)
    for whole, part in zip(full, capped, strict=True):
        assert np.isin(part, whole).all()  # a subset of the uncapped share
        assert len(np.unique(part)) == len(part)
        classes, counts = np.unique(labels[whole], return_counts=True)
        kept = dict(zip(*np.unique(labels[part], return_counts=True), strict=True))
        # every class of the share survives, with min(cap, what the share held) samples
        assert kept == {int(c): min(cap, int(n)) for c, n in zip(classes, counts, strict=True)}
    everything = np.concatenate(capped)
    assert len(np.unique(everything)) == len(everything)  # still no sample in two parts


def test_the_cap_is_seeded() -> None:
    labels = skewed_labels()
    first = make_partition("classes", labels, 5, 7, classes_per_client=3, samples_per_class=4)
    again = make_partition("classes", labels, 5, 7, classes_per_client=3, samples_per_class=4)
    other = make_partition("classes", labels, 5, 8, classes_per_client=3, samples_per_class=4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_a_cap_below_one_is_refused() -> None:
    labels = skewed_labels()
    with pytest.raises(ValueError, match="samples_per_class"):
        cap_per_class(labels, [np.arange(10)], 0, seed=0)
    with pytest.raises(ValueError):
        AgentSettings(partition="classes", num_partitions=4, samples_per_class=0)


def test_an_agent_of_a_few_shot_fleet_holds_its_classes_capped() -> None:
    task = resolve_task("digits")
    settings = AgentSettings(partition="classes", num_partitions=20, partition_index=3, classes_per_client=3,
                             samples_per_class=10)
    local = build_local_data(task, partition=settings.partition, num_partitions=settings.num_partitions,
                             partition_index=settings.partition_index, classes_per_client=settings.classes_per_client,
                             samples_per_class=settings.samples_per_class)
    labels = np.concatenate([local.train.y, local.held_out.y])
    classes, counts = np.unique(labels, return_counts=True)
    assert len(classes) == 3 and (counts == 10).all()  # 6 agents share each class's ~144: ~24 each, capped
    uncapped = build_local_data(task, partition="classes", num_partitions=20, partition_index=3, classes_per_client=3)
    assert set(np.unique(uncapped.train.y)) == set(classes) and len(uncapped.train) > 2 * len(local.train)
