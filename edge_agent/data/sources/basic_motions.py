"""BasicMotions: real smartwatch recordings (3-D accelerometer + 3-D gyroscope, 100 steps at 10 Hz).

Four activities x 10 recordings per split. The files ship inside the sktime (or aeon) wheel,
so no download is needed; only the files are read, the package is never imported.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources.label_space import class_index, known
from edge_agent.data.sources.registry import SOURCES, DataSource, SourceRequest
from edge_agent.data.sources.report import DataSourceError, LoadReport

BASIC_MOTIONS_CLASSES = ("standing", "walking", "running", "badminton")
_PACKAGES = ("sktime", "aeon")


def basic_motions_dir() -> Path:
    """The BasicMotions folder inside an installed sktime or aeon, found without importing them."""
    for package in _PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            folder = Path(location) / "datasets" / "data" / "BasicMotions"
            if (folder / "BasicMotions_TRAIN.ts").is_file():
                return folder
    raise DataSourceError("the BasicMotions files were not found in sktime or aeon; "
                          "pip install sktime (only its data files are read, it is never imported)")


def read_ts(path: Path) -> tuple[np.ndarray, list[str]]:
    """Parse an equal-length, classified ``.ts`` file into float32 [N, dims, length] and raw labels.

    After ``@data`` each line is ``dim1:dim2:...:label`` with comma-separated values per dimension.
    """
    series: list[list[list[float]]] = []
    labels: list[str] = []
    in_data = False
    with Path(path).open(encoding="utf-8") as f:
        for line_no, raw in enumerate(f, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                in_data = line.lower().startswith("@data")
                continue
            *dims, label = line.split(":")
            try:
                values = [[float(v) for v in dim.split(",")] for dim in dims]
            except ValueError as exc:
                raise DataSourceError(f"{path}:{line_no}: {exc}; only complete numeric series are supported") from exc
            if series and [len(d) for d in values] != [len(d) for d in series[0]]:
                raise DataSourceError(f"{path}:{line_no}: series shape differs from line 1 of the data; "
                                      "only equal-length series are supported")
            series.append(values)
            labels.append(label.strip())
    if not series:
        raise DataSourceError(f"{path}: no @data section with series")
    return np.asarray(series, dtype=np.float32), labels


def load_basic_motions(split: Literal["train", "test"]) -> tuple[np.ndarray, list[str]]:
    """x float32 [40, 6, 100] and lower-case labels ('standing', 'walking', 'running', 'badminton')."""
    if split not in ("train", "test"):
        raise DataSourceError(f"BasicMotions split must be 'train' or 'test', got {split!r}")
    x, labels = read_ts(basic_motions_dir() / f"BasicMotions_{split.upper()}.ts")
    return x, [label.lower() for label in labels]


def motion_windows(x: np.ndarray, labels: Sequence[str], classes: Sequence[str], window: int = 50,
                   stride: int = 10, name: str = "basic-motions") -> Dataset:
    """Overlapping windows [N * k, dims, window] cut within each recording.

    The train/test split stays by recording, so overlapping windows never leak across it.
    """
    index = class_index(classes)
    if x.ndim != 3 or len(labels) != len(x) or not 1 <= window <= x.shape[2] or stride < 1:
        raise DataSourceError(f"{name}: need x [N, dims, T] with one label per recording and "
                              f"1 <= window <= T, stride >= 1; got x{list(x.shape)}, {len(labels)} labels, "
                              f"window={window}, stride={stride}")
    unknown = sorted(set(labels) - index.keys())
    if unknown:
        raise DataSourceError(f"{name}: labels {unknown} are not classes of this task (known: {known(classes)})")
    cut = sliding_window_view(x, window, axis=2)[:, :, ::stride]  # [N, dims, k, window]
    per = cut.shape[2]
    windows = np.ascontiguousarray(cut.transpose(0, 2, 1, 3).reshape(-1, x.shape[1], window), dtype=np.float32)
    y = np.repeat(np.asarray([index[label] for label in labels], dtype=np.int64), per)
    return Dataset(windows, y, len(classes), name)


SETS = {"basic-motions": "train", "basic-motions:test": "test"}
"""The data-source names of the two splits."""


@lru_cache(maxsize=2)
def _windows(split: str, classes: tuple[str, ...], window: int, stride: int) -> Dataset:
    x, labels = load_basic_motions(split)  # type: ignore[arg-type]
    return motion_windows(x, labels, classes, window=window, stride=stride)


def _load_set(source: str, request: SourceRequest) -> tuple[Dataset, LoadReport]:
    shape = request.shape
    return _windows(SETS[source], tuple(request.classes), shape["window"], shape["stride"]), LoadReport()


SOURCES.register(
    "basic_motions", DataSource(SETS.__contains__, _load_set, form=", ".join(SETS)),
    summary="BasicMotions smartwatch recordings from sktime's data files, cut into overlapping windows",
    kinds=("windows",), tasks=("basic-motions",))
