"""Data-source strings the built-in tasks accept: a named built-in set, or a path to the device's files."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources import load_image_folder, load_npz, load_sensor_windows
from edge_agent.tasks.base import DataContext

BuiltinSet = Callable[[DataContext], Dataset]


def load_image_source(source: str, context: DataContext, *, builtin: Mapping[str, BuiltinSet],
                      size: tuple[int, int], channels: int = 1) -> Dataset:
    """A built-in set by name, an .npz file, or a folder of images in class sub-folders (resized to ``size``)."""
    if source in builtin:
        return builtin[source](context)
    path = Path(source)
    if path.is_dir():
        data, report = load_image_folder(path, context.classes, size=size, channels=channels)
    elif path.suffix == ".npz" and path.is_file():
        data, report = load_npz(path, context.classes)
    else:
        raise ValueError(f"data source {source!r} is none of {', '.join(builtin)}, an existing .npz file or a folder "
                         f"of images in class sub-folders")
    context.report.merge(report)
    return data


def load_sensor_source(source: str, context: DataContext, *, builtin: Mapping[str, BuiltinSet],
                       columns: tuple[str, ...], window: int, stride: int) -> Dataset:
    """A built-in set by name, an .npz of windows, or CSV/Parquet readings with a ``label`` column."""
    if source in builtin:
        return builtin[source](context)
    path = Path(source)
    if path.suffix in (".csv", ".parquet") and path.is_file():
        data, report = load_sensor_windows(path, context.classes, channels=columns, window=window, stride=stride)
    elif path.suffix == ".npz" and path.is_file():
        data, report = load_npz(path, context.classes, windows=True)
    else:
        raise ValueError(f"data source {source!r} is none of {', '.join(builtin)}, an existing .csv, .parquet "
                         f"or .npz file")
    context.report.merge(report)
    return data
