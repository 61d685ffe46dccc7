"""Timing shared by the benchmarks: medians of interleaved runs."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(operations: dict[str, Callable[[], Any]], repetitions: int) -> dict[str, float]:
    """Median wall time of each operation, taking turns (one run of each per repetition) so that
    a busy moment on the machine falls on all of them alike; each result is dropped before the
    next run starts."""
    times: dict[str, list[float]] = {name: [] for name in operations}
    for operation in operations.values():
        operation()  # warm-up
    for _ in range(repetitions):
        for name, operation in operations.items():
            gc.collect()
            start = time.perf_counter()
            result = operation()
            times[name].append(time.perf_counter() - start)
            del result
    return {name: statistics.median(values) for name, values in times.items()}
