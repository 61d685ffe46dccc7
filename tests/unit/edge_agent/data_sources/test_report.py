"""LoadReport: counts, the first few examples per reason, one-line summary, merging."""

from __future__ import annotations

import pytest

from edge_agent.data.sources import DataSourceError, LoadReport, class_index


def test_drop_keeps_counts_and_first_three_examples() -> None:
    report = LoadReport()
    for name in ("a.png", "b.png", "c.png", "d.png"):
        report.drop("corrupt_image", name)
    report.drop("short_segment", "s.csv:2-4", 3)
    assert report.dropped == {"corrupt_image": 4, "short_segment": 3}
    assert report.examples["corrupt_image"] == ["a.png", "b.png", "c.png"]
    assert report.summary() == "dropped 4 corrupt_image (a.png, b.png, c.png); dropped 3 short_segment (s.csv:2-4)"


def test_summary_counts_warnings_and_says_clean_when_empty() -> None:
    assert LoadReport().summary() == "clean"
    report = LoadReport()
    report.drop("corrupt_image", "a.png")
    report.drop("corrupt_image", "b.png")
    report.warn("no images for cat")
    assert report.summary() == "dropped 2 corrupt_image (a.png, b.png); 1 warning"
    report.warn("another")
    assert report.summary().endswith("; 2 warnings")


def test_merge_adds_counts_and_caps_examples() -> None:
    first, second = LoadReport(), LoadReport()
    first.drop("bad_row", "a.csv:2")
    first.drop("bad_row", "a.csv:3")
    second.drop("bad_row", "b.csv:5")
    second.drop("bad_row", "b.csv:6")
    second.warn("w")
    assert first.merge(second) is first
    assert first.dropped["bad_row"] == 4
    assert first.examples["bad_row"] == ["a.csv:2", "a.csv:3", "b.csv:5"]
    assert first.warnings == ["w"]


def test_class_index_maps_names_to_labels_and_refuses_ambiguity() -> None:
    assert class_index(("cat", "dog")) == {"cat": 0, "dog": 1}
    with pytest.raises(DataSourceError, match="'cat' is declared twice"):
        class_index(("cat", "dog", "cat"))
    with pytest.raises(DataSourceError, match="non-empty"):
        class_index(())
    assert issubclass(DataSourceError, ValueError)
