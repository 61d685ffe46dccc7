"""A built-in set's training pool and test split, for simulations and benchmarks that score centrally."""

from __future__ import annotations

from edge_agent.data.datasets import Dataset
from edge_agent.tasks.base import DataContext, Task


def pool_and_test(task: Task, data: str | None = None, seed: int = 0) -> tuple[Dataset, Dataset]:
    """(``NAME``, ``NAME:test``) of a built-in set: the pool a simulated fleet partitions and the split no
    agent ever sees. ``data`` defaults to the task's built-in set."""
    source = data or task.default_data
    if source is None:
        raise ValueError(f"task {task.card.ref} has no built-in data set to simulate a fleet with")
    context = DataContext(classes=tuple(task.classes), seed=seed)
    pool = task.load(source, context)  # a missing package or file says so here, in its own words
    try:
        test = task.load(f"{source}:test", context)
    except ValueError as exc:
        raise ValueError(f"data {source!r} has no test split ({source}:test) to score on: {exc}") from None
    return pool, test
