"""The registry of data sources: which loader reads a device's data, chosen from the data-source
string a task is given (``--data``, ``eval_data``).

Each loader file registers a :class:`DataSource`: whether a string names its data (a path of its
form, or the name of a set it ships), how it loads it into the task's label space, and how such a
string is written (for the error that lists them). Its compatibility names the data ``kinds`` it
produces (``images`` [N, C, H, W], ``windows`` [N, channels, T]) and, for a set that only one task
can label, its ``tasks``. Built-in tasks choose through :func:`find_source`
(``edge_agent/tasks/builtin/sources.py``); adding a loader is one file registering itself plus its
import in ``edge_agent/data/sources/__init__.py``, and third parties register under
``edgefl.data_sources``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources.report import LoadReport
from protocol.registry import Entry, Registry


@dataclass(frozen=True)
class SourceRequest:
    """What a task asks of a loader: its label space, and the kind and shape of its samples."""

    classes: tuple[str, ...]
    kind: str
    """``images`` or ``windows``."""
    shape: Mapping[str, Any] = field(default_factory=dict)
    """images: ``size`` (height, width) and ``channels``; windows: ``columns``, ``window``, ``stride``."""


@dataclass(frozen=True)
class DataSource:
    accepts: Callable[[str], bool]
    """Whether a data-source string names this loader's data."""
    load: Callable[[str, SourceRequest], tuple[Dataset, LoadReport]]
    form: str
    """How such a string is written, e.g. ``an existing .npz file``."""


SOURCES: Registry[DataSource] = Registry("data source", "edgefl.data_sources")


def _usable(entry: Entry[DataSource], kind: str, task: str | None) -> bool:
    # A set that only some tasks can label is offered to those tasks only (to none when the task is not named).
    return entry.supports("kinds", kind) and ("tasks" not in entry.compatible or entry.supports("tasks", task or ""))


def find_source(source: str, kind: str, task: str | None = None) -> Entry[DataSource] | None:
    """The first registered loader of ``kind`` data (for ``task``) that accepts ``source``, if any."""
    return next((e for e in SOURCES if _usable(e, kind, task) and e.value.accepts(source)), None)


def source_forms(kind: str, task: str | None = None) -> list[str]:
    """How the loaders of ``kind`` data (for ``task``) are named, in registration order."""
    return [e.value.form for e in SOURCES if _usable(e, kind, task)]
