"""Data-source loaders: a device's own files turned into a ``Dataset`` in the task's declared label space.

Every loader takes the task's class names (index = label) rather than inferring them from the
data, so devices with skewed or missing classes still agree on the label space. Each returns
``(Dataset, LoadReport)``: noise (a corrupt image, a bad row) is dropped and counted in the
report; configuration mistakes (an undeclared class, a missing column) raise ``DataSourceError``.

Each loader registers itself in ``SOURCES`` (``registry.py``), which chooses one by the data-source
string; importing this package registers them all (in the order imported below).
"""

from __future__ import annotations

from edge_agent.data.sources.basic_motions import (
    BASIC_MOTIONS_CLASSES,
    basic_motions_dir,
    load_basic_motions,
    motion_windows,
    read_ts,
)
from edge_agent.data.sources.image_folder import load_image_folder
from edge_agent.data.sources.label_space import class_index
from edge_agent.data.sources.npz import load_npz
from edge_agent.data.sources.registry import SOURCES, DataSource, SourceRequest, find_source
from edge_agent.data.sources.report import DataSourceError, LoadReport
from edge_agent.data.sources.sensor_windows import load_sensor_windows

__all__ = [
    "BASIC_MOTIONS_CLASSES",
    "SOURCES",
    "DataSource",
    "DataSourceError",
    "LoadReport",
    "SourceRequest",
    "basic_motions_dir",
    "class_index",
    "find_source",
    "load_basic_motions",
    "load_image_folder",
    "load_npz",
    "load_sensor_windows",
    "motion_windows",
    "read_ts",
]
