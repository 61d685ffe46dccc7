"""Data sources are chosen through their registry: by the form of the data-source string, among the
loaders of the task's data kind (and, for a set only one task can label, of that task)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.data.sources import SOURCES, find_source
from edge_agent.tasks import resolve_task
from edge_agent.tasks.base import DataContext


def test_each_loader_is_registered_with_the_kinds_it_produces() -> None:
    kinds = {e.name: set(e.compatible["kinds"]) for e in SOURCES}
    assert kinds == {"basic_motions": {"windows"}, "image_folder": {"images"}, "npz": {"images", "windows"},
                     "sensor_windows": {"windows"}}
    assert SOURCES.entry("basic_motions").compatible["tasks"] == {"basic-motions"}


def test_a_source_string_picks_its_loader_by_form(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    np.savez(tmp_path / "d.npz", x=np.zeros((2, 8, 8)), y=np.zeros(2, np.int64))
    (tmp_path / "r.csv").write_text("label\n")
    cases = [("imgs", "images", "image_folder"), ("d.npz", "images", "npz"), ("d.npz", "windows", "npz"),
             ("r.csv", "windows", "sensor_windows"), ("r.csv", "images", None), ("missing.npz", "images", None)]
    for source, kind, loader in cases:
        assert getattr(find_source(str(tmp_path / source), kind), "name", None) == loader, (source, kind)
    assert find_source("basic-motions", "windows", "basic-motions").name == "basic_motions"  # type: ignore[union-attr]
    assert find_source("basic-motions", "windows", "my-task") is None  # its labels are that task's


def test_an_unknown_source_names_what_the_task_accepts() -> None:
    digits = resolve_task("digits")
    with pytest.raises(ValueError, match="is none of digits, digits:test, .*a folder of images in class sub-folders "
                                         "or an existing .npz file"):
        digits.load("nope.txt", DataContext(classes=tuple(digits.classes), seed=0))
