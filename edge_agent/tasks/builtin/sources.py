"""Data-source strings the built-in tasks accept: a named built-in set of the task, or what a
registered loader accepts (a path to the device's files, a set it ships), chosen through
``edge_agent.data.sources.registry``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources.registry import SourceRequest, find_source, source_forms
from edge_agent.tasks.base import DataContext

BuiltinSet = Callable[[DataContext], Dataset]


def load_image_source(source: str, context: DataContext, *, builtin: Mapping[str, BuiltinSet],
                      size: tuple[int, int], channels: int = 1, task: str | None = None) -> Dataset:
    """A built-in set by name, an .npz file, or a folder of images in class sub-folders (resized to ``size``)."""
    request = SourceRequest(tuple(context.classes), "images", {"size": size, "channels": channels})
    return _load(source, context, builtin, request, task)


def load_sensor_source(source: str, context: DataContext, *, builtin: Mapping[str, BuiltinSet],
                       columns: tuple[str, ...], window: int, stride: int, task: str | None = None) -> Dataset:
    """A built-in set by name, an .npz of windows, or CSV/Parquet readings with a ``label`` column."""
    request = SourceRequest(tuple(context.classes), "windows", {"columns": columns, "window": window, "stride": stride})
    return _load(source, context, builtin, request, task)


def _load(source: str, context: DataContext, builtin: Mapping[str, BuiltinSet], request: SourceRequest,
          task: str | None) -> Dataset:
    if source in builtin:
        return builtin[source](context)
    entry = find_source(source, request.kind, task)
    if entry is None:
        choices = [*builtin, *source_forms(request.kind, task)]
        raise ValueError(f"data source {source!r} is none of {', '.join(choices[:-1])} or {choices[-1]}")
    data, report = entry.value.load(source, request)
    context.report.merge(report)
    return data
