"""Arrays exported with ``np.savez`` (MNIST, CIFAR-10, pre-cut sensor windows) in the task's label space.

The width of the label space comes from the task, never from the largest label in the file:
a device whose data happens to hold only a few classes must still build the full head.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources.label_space import class_index
from edge_agent.data.sources.registry import SOURCES, DataSource
from edge_agent.data.sources.report import DataSourceError, LoadReport


def _labels(path: Path, y: np.ndarray, num_classes: int) -> np.ndarray:
    """int64 labels, refusing anything that is not a whole number in [0, num_classes)."""
    y = y.reshape(-1)
    if not (np.issubdtype(y.dtype, np.integer) or (np.issubdtype(y.dtype, np.floating) and np.all(y == np.round(y)))):
        raise DataSourceError(f"{path}: labels must be integer class indices, got dtype {y.dtype}")
    bad = (y < 0) | (y >= num_classes)
    if bad.any():
        value = y[bad][0]
        raise DataSourceError(f"{path}: label {value:g} at index {int(np.argmax(bad))} is outside the task's "
                              f"{num_classes} classes (valid labels 0..{num_classes - 1}); "
                              f"{int(bad.sum())} labels out of range")
    return y.astype(np.int64)


def _inputs(path: Path, x: np.ndarray, windows: bool) -> np.ndarray:
    """float32 [N, ...]: images moved to [N, C, H, W], 0..255 integers scaled to [0, 1]."""
    if x.ndim < 2:
        raise DataSourceError(f"{path}: inputs must be [N, ...], got shape {x.shape}")
    if windows:
        pass  # [N, C, T] sensor windows: rank 3 like grayscale images, so the caller must say which
    elif x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = np.transpose(x, (0, 3, 1, 2))
    if np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
        if x.size and (x.min() < 0 or x.max() > 255):
            raise DataSourceError(f"{path}: integer inputs are read as 0..255 pixels but range "
                                  f"{x.min()}..{x.max()}; save other readings as float32")
        return np.ascontiguousarray(x, dtype=np.float32) / np.float32(255.0)
    if not np.issubdtype(x.dtype, np.floating):
        raise DataSourceError(f"{path}: inputs must be numeric, got dtype {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.float32)


def load_npz(path: Path, classes: Sequence[str], *, name: str | None = None,
             windows: bool = False) -> tuple[Dataset, LoadReport]:
    """Inputs under ``x``/``images``, labels under ``y``/``labels``; no train/test split (the caller splits).

    Images [N, H, W] gain a channel axis and [N, H, W, C] become [N, C, H, W]; other ranks pass
    through. ``windows=True`` passes every rank through, for sensor windows [N, C, T].
    """
    path = Path(path)
    class_index(classes)
    if not path.is_file():
        raise DataSourceError(f"{path}: no such file")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataSourceError(f"{path}: not a readable .npz archive ({exc}); re-export it with np.savez") from exc
    if not hasattr(archive, "files"):  # a bare .npy array, not an archive of named arrays
        raise DataSourceError(f"{path}: a single array, not an .npz archive; save with np.savez(path, x=..., y=...)")
    with archive:
        keys = sorted(archive.files)
        x_key = next((k for k in ("x", "images") if k in keys), None)
        y_key = next((k for k in ("y", "labels") if k in keys), None)
        if x_key is None or y_key is None:
            raise DataSourceError(f"{path}: expected arrays 'x' (or 'images') and 'y' (or 'labels'), found {keys}")
        try:
            raw_x, raw_y = archive[x_key], archive[y_key]
        except ValueError as exc:  # object arrays need pickle, which would run code from the file
            raise DataSourceError(f"{path}: {exc}; save plain numeric arrays") from exc
    x, y = _inputs(path, raw_x, windows), _labels(path, raw_y, len(classes))
    if len(y) != len(x) or len(y) == 0:
        raise DataSourceError(f"{path}: {len(x)} inputs but {len(y)} labels; need one label per sample and >= 1 sample")
    return Dataset(x, y, len(classes), name or path.stem), LoadReport()


def _is_npz(source: str) -> bool:
    path = Path(source)
    return path.suffix == ".npz" and path.is_file()


SOURCES.register(
    "npz", DataSource(_is_npz, lambda source, request: load_npz(Path(source), request.classes,
                                                                windows=request.kind == "windows"),
                      form="an existing .npz file"),
    summary="arrays saved with np.savez: x (or images) and y (or labels)", kinds=("images", "windows"))
