"""Seeded partitioners: exact covers, determinism, the skew they promise, and refusals.

numpy only (no torch): the partitioners are pure functions of labels, arguments and seed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.data.partition import (
    format_summary,
    kl_to_global,
    make_partition,
    partition_classes,
    partition_dirichlet,
    partition_iid,
    summarize,
)

FAST = settings(deadline=None, max_examples=40)

Partitioner = Callable[[np.ndarray, int, int], list[np.ndarray]]

def classes_needed(labels: np.ndarray, clients: int) -> int:
    """The fewest classes per client (at least 2, where there are 2) that still cover every class."""
    num_classes = len(np.unique(labels))
    return min(num_classes, max(2, -(-num_classes // clients)))


PARTITIONERS: dict[str, Partitioner] = {
    "iid": lambda labels, clients, seed: partition_iid(labels, clients, seed),
    "dirichlet": lambda labels, clients, seed: partition_dirichlet(labels, clients, 0.5, seed, min_size=0),
    "classes": lambda labels, clients, seed: partition_classes(labels, clients, classes_needed(labels, clients), seed),
}


def balanced_labels(num_classes: int, per_class: int, seed: int = 0) -> np.ndarray:
    labels = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(labels)


@st.composite
def label_sets(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    num_classes = draw(st.integers(2, 10))
    labels = draw(st.lists(st.integers(0, num_classes - 1), min_size=num_classes, max_size=400))
    labels[:num_classes] = range(num_classes)  # every class present at least once
    clients = draw(st.integers(1, min(12, len(labels) // 2)))
    return np.array(labels, dtype=np.int64), clients


def assert_exact_cover(parts: list[np.ndarray], n: int, clients: int) -> None:
    assert len(parts) == clients
    joined = np.concatenate(parts)
    assert joined.size == n, "a sample is missing or assigned twice"
    assert np.array_equal(np.sort(joined), np.arange(n))
    for part in parts:
        assert part.dtype.kind in "iu"
        assert np.all(np.diff(part) > 0), "each client's indices are sorted and unique"


@FAST
@given(label_sets(), st.integers(0, 2**32 - 1), st.sampled_from(sorted(PARTITIONERS)))
def test_every_sample_is_assigned_exactly_once(case: tuple[np.ndarray, int], seed: int, kind: str) -> None:
    labels, clients = case
    assert_exact_cover(PARTITIONERS[kind](labels, clients, seed), len(labels), clients)


@pytest.mark.parametrize("kind", sorted(PARTITIONERS))
def test_same_seed_same_partition_other_seed_another(kind: str) -> None:
    labels = balanced_labels(10, 40)
    first = PARTITIONERS[kind](labels, 8, 123)
    again = PARTITIONERS[kind](labels, 8, 123)
    other = PARTITIONERS[kind](labels, 8, 124)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_partitioning_does_not_touch_the_labels() -> None:
    labels = balanced_labels(5, 20)
    before = labels.copy()
    for partition in PARTITIONERS.values():
        partition(labels, 4, 0)
    assert np.array_equal(labels, before)


@FAST
@given(st.integers(20, 500), st.integers(1, 20), st.integers(0, 1000))
def test_iid_sizes_differ_by_at_most_one(n: int, clients: int, seed: int) -> None:
    parts = partition_iid(balanced_labels(4, n // 4 + 1)[:n], clients, seed)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@FAST
@given(st.integers(1, 10), st.integers(0, 8), st.sampled_from([0.1, 0.5, 1.0, 10.0]), st.integers(0, 1000))
def test_dirichlet_respects_min_size(clients: int, min_size: int, alpha: float, seed: int) -> None:
    labels = balanced_labels(10, 30)
    parts = partition_dirichlet(labels, clients, alpha, seed, min_size=min_size)
    assert_exact_cover(parts, len(labels), clients)
    assert min(len(p) for p in parts) >= min_size


def mean_kl(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> float:
    return float(np.mean([row.kl_divergence for row in summarize(labels, parts, num_classes)]))


def test_dirichlet_skew_grows_as_alpha_falls() -> None:
    labels = balanced_labels(10, 100)
    skew = {
        alpha: np.mean([mean_kl(partition_dirichlet(labels, 10, alpha, seed, min_size=5), labels, 10)
                        for seed in range(5)])
        for alpha in (100.0, 1.0, 0.1)
    }
    assert skew[100.0] < skew[1.0] < skew[0.1]
    assert skew[0.1] > 1.0  # with alpha 0.1 most clients hold a handful of classes (ln 10 = 2.3 max)


@FAST
@given(st.integers(5, 20), st.integers(1, 10), st.integers(0, 1000))
def test_classes_gives_each_client_exactly_k_classes(clients: int, k: int, seed: int) -> None:
    labels = balanced_labels(10, 50)
    if clients * k < 10:
        with pytest.raises(ValueError):
            partition_classes(labels, clients, k, seed)
        return
    parts = partition_classes(labels, clients, k, seed)
    assert_exact_cover(parts, len(labels), clients)
    for row in summarize(labels, parts, 10):
        assert row.classes == k
    # Each class is split evenly among the clients that hold it.
    for c in range(10):
        shares = [int(np.sum(labels[p] == c)) for p in parts if np.any(labels[p] == c)]
        assert max(shares) - min(shares) <= 1


def test_summary_reports_samples_classes_and_kl() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2])
    parts = [np.array([0, 2, 4]), np.array([1]), np.array([3, 5])]
    rows = summarize(labels, parts, 3)
    assert [(r.client, r.samples, r.classes) for r in rows] == [(0, 3, 3), (1, 1, 1), (2, 2, 2)]
    assert rows[0].kl_divergence == pytest.approx(0.0)
    assert rows[1].kl_divergence == pytest.approx(np.log(3))
    assert rows[2].kl_divergence == pytest.approx(np.log(3 / 2))
    table = format_summary(rows)
    assert table.splitlines()[0].startswith("client")
    assert len(table.splitlines()) == 4


def test_kl_of_an_empty_client_is_zero() -> None:
    assert kl_to_global(np.array([], dtype=np.int64), np.array([0, 1]), 2) == 0.0


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda y: partition_iid(y, 0, 0), id="iid-no-clients"),
        pytest.param(lambda y: partition_iid(y, len(y) + 1, 0), id="iid-more-clients-than-samples"),
        pytest.param(lambda y: partition_dirichlet(y, 0, 0.5, 0), id="dirichlet-no-clients"),
        pytest.param(lambda y: partition_dirichlet(y, 4, 0.0, 0), id="dirichlet-zero-alpha"),
        pytest.param(lambda y: partition_dirichlet(y, 4, -1.0, 0), id="dirichlet-negative-alpha"),
        pytest.param(lambda y: partition_dirichlet(y, 4, 0.5, 0, min_size=len(y)), id="dirichlet-min-size-too-big"),
        pytest.param(lambda y: partition_dirichlet(y, 10, 0.01, 0, min_size=10, max_attempts=3),
                     id="dirichlet-unreachable"),
        pytest.param(lambda y: partition_classes(y, 4, 0, 0), id="classes-zero"),
        pytest.param(lambda y: partition_classes(y, 4, 11, 0), id="classes-more-than-exist"),
        pytest.param(lambda y: partition_classes(y, 3, 3, 0), id="classes-cannot-cover"),
        pytest.param(lambda y: partition_classes(y, len(y) + 1, 10, 0), id="classes-more-clients-than-samples"),
        pytest.param(lambda y: make_partition("shards", y, 4, 0), id="unknown-kind"),
    ],
)
def test_impossible_requests_raise_value_error(call: Callable[[np.ndarray], list[np.ndarray]]) -> None:
    with pytest.raises(ValueError):
        call(balanced_labels(10, 10))


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "classes"])
def test_make_partition_dispatches(kind: str) -> None:
    labels = balanced_labels(10, 20)
    parts = make_partition(kind, labels, 5, 3, alpha=0.5, min_size=2, classes_per_client=3)
    assert_exact_cover(parts, len(labels), 5)
    direct = {
        "iid": lambda: partition_iid(labels, 5, 3),
        "dirichlet": lambda: partition_dirichlet(labels, 5, 0.5, 3, min_size=2),
        "classes": lambda: partition_classes(labels, 5, 3, 3),
    }[kind]()
    assert all(np.array_equal(a, b) for a, b in zip(parts, direct, strict=True))

