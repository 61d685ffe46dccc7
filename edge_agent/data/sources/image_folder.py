"""Images in ``root/<class name>/`` folders: the layout phones and cameras naturally produce.

Decoding uses Pillow only (bilinear resize), so the same files give the same arrays on every
device whatever else is installed; unreadable files are dropped and reported, not fatal.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources.label_space import class_index, known
from edge_agent.data.sources.registry import SOURCES, DataSource
from edge_agent.data.sources.report import DataSourceError, LoadReport


def _visible(folder: Path) -> list[Path]:
    """Non-hidden entries, sorted by name so every run visits files in the same order."""
    return sorted((p for p in folder.iterdir() if not p.name.startswith(".")), key=lambda p: p.name)


def _decode(path: Path, mode: str, size: tuple[int, int]) -> np.ndarray:
    """One image as float32 [C, H, W] in [0, 1]; raises whatever the decoder raises."""
    from PIL import Image

    with Image.open(path) as img:
        img.load()  # truncated files fail here, not later
        img = img.convert(mode).resize((size[1], size[0]), Image.Resampling.BILINEAR)
        arr = np.asarray(img, dtype=np.float32) / 255.0
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def load_image_folder(root: Path, classes: Sequence[str], *, size: tuple[int, int], channels: int = 1,
                      name: str | None = None) -> tuple[Dataset, LoadReport]:
    """Load ``root/<class>/<image>`` into float32 [N, C, H, W] with labels in the declared ``classes``.

    A folder for an undeclared class is a configuration error; a missing or empty class folder
    is only a warning, since a device in a non-IID fleet may simply not have seen that class.
    """
    root = Path(root)
    index = class_index(classes)
    if channels not in (1, 3):
        raise DataSourceError(f"{root}: channels must be 1 (grayscale) or 3 (RGB), got {channels}")
    if len(size) != 2 or min(size) < 1:
        raise DataSourceError(f"{root}: size must be (height, width) in pixels, got {size}")
    if not root.is_dir():
        raise DataSourceError(f"{root}: not a folder; expected one sub-folder per class ({known(classes)})")
    report = LoadReport()
    folders = []
    for entry in _visible(root):
        if not entry.is_dir():
            report.warn(f"{entry}: ignored, images must sit in a class folder")
        elif entry.name not in index:
            raise DataSourceError(f"{entry}: folder {entry.name!r} is not a class of this task; rename or remove it "
                                  f"(known classes: {known(classes)})")
        else:
            folders.append(entry)

    mode = "L" if channels == 1 else "RGB"
    images: list[np.ndarray] = []
    labels: list[int] = []
    for folder in folders:
        for path in _visible(folder):
            if path.is_dir():
                report.warn(f"{path}: nested folder ignored")
                continue
            try:
                images.append(_decode(path, mode, size))
            except Exception:  # Pillow raises OSError, SyntaxError, EOFError, ... for bad files
                report.drop("corrupt_image", path.name)
                continue
            labels.append(index[folder.name])

    present = set(labels)
    missing = [c for c in classes if index[c] not in present]
    if missing and labels:
        report.warn(f"{root}: no images for {len(missing)} of {len(classes)} classes: {known(missing)}")
    if not images:
        detail = f" ({report.summary()})" if report.dropped else ""
        raise DataSourceError(f"{root}: no readable images{detail}; expected files in {root}/<class>/ "
                              f"for classes {known(classes)}")
    x = np.stack(images).astype(np.float32, copy=False)
    return Dataset(x, np.asarray(labels, dtype=np.int64), len(classes), name or root.name), report


SOURCES.register(
    "image_folder", DataSource(lambda source: Path(source).is_dir(),
                               lambda source, request: load_image_folder(Path(source), request.classes,
                                                                         **request.shape),
                               form="a folder of images in class sub-folders"),
    summary="images in root/<class name>/ folders, decoded with Pillow and resized", kinds=("images",))
