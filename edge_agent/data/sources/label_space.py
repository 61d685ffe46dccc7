"""The task's declared label space: class name -> index, checked once for every loader.

Labels come from the task, never from the data, so a device that lacks some classes still
builds a head of the full width and its updates line up with everyone else's.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge_agent.data.sources.report import DataSourceError


def class_index(classes: Sequence[str]) -> dict[str, int]:
    """Map each declared class name to its label; refuse an empty or ambiguous label space."""
    if isinstance(classes, str) or not classes:
        raise DataSourceError(f"the task must declare its classes as a non-empty list of names, got {classes!r}")
    index: dict[str, int] = {}
    for i, name in enumerate(classes):
        if not isinstance(name, str) or not name:
            raise DataSourceError(f"class {i} must be a non-empty name, got {name!r}; fix the task's classes")
        if name in index:
            raise DataSourceError(f"class {name!r} is declared twice (labels {index[name]} and {i}); "
                                  "fix the task's classes")
        index[name] = i
    return index


def known(classes: Sequence[str]) -> str:
    """The declared classes for an error message, shortened when there are many."""
    shown = ", ".join(classes[:20])
    return shown + (f", ... ({len(classes)} in all)" if len(classes) > 20 else "")
