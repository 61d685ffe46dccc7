"""Sensor tables: windows within contiguous segments, bad rows dropped, configuration mistakes refused."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edge_agent.data.sources import DataSourceError, load_sensor_windows

CLASSES = ("idle", "walk", "run")
HEADER = ["t", "ax", "ay", "label", "user"]


def readings() -> list[list[object]]:
    """Rows for CSV lines 2..19 (the header is line 1); ax = line number, ay = -line number.

    lines 2-8 walk/u1 (7 rows), 9 bad, 10-11 walk/u1 (2 rows, short), 12-15 run/u1 (4 rows),
    16-18 run/u2 (3 rows), 19 empty label.
    """
    rows: list[list[object]] = []
    for line in range(2, 20):
        label = "walk" if line <= 11 else "run"
        user = "u2" if 16 <= line <= 18 else "u1"
        rows.append([line, float(line), -float(line), label, user])
    rows[9 - 2][1] = None  # empty reading
    rows[19 - 2][3] = None  # empty label
    return rows


def write_csv(path: Path, rows: list[list[object]], header: list[str] = HEADER) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([["" if v is None else v for v in row] for row in rows])
    return path


def write_parquet(path: Path, rows: list[list[object]]) -> Path:
    columns = {name: [row[i] for row in rows] for i, name in enumerate(HEADER)}
    pq.write_table(pa.table(columns), path, row_group_size=5)  # several batches
    return path


def load(path: Path, **kwargs: object):
    options = {"channels": ("ax", "ay"), "window": 3, "stride": 2, "group_column": "user"} | kwargs
    return load_sensor_windows(path, CLASSES, **options)  # type: ignore[arg-type]


def test_windows_stay_inside_label_and_group_segments(tmp_path: Path) -> None:
    data, report = load(write_csv(tmp_path / "watch.csv", readings()))
    assert data.x.shape == (5, 2, 3) and data.x.dtype == np.float32
    assert data.y.tolist() == [1, 1, 1, 2, 2] and data.num_classes == 3 and data.name == "watch"
    starts = data.x[:, 0, 0].tolist()
    assert starts == [2, 4, 6, 12, 16]  # walk 2-8 every 2 rows; run/u1 12-15; run/u2 16-18
    np.testing.assert_array_equal(data.x[1], [[4, 5, 6], [-4, -5, -6]])
    assert report.dropped == {"bad_row": 2, "short_segment": 2}
    assert report.examples == {"bad_row": ["watch.csv:9", "watch.csv:19"], "short_segment": ["watch.csv:10-11"]}


def test_without_group_column_users_join_one_segment(tmp_path: Path) -> None:
    data, _ = load(write_csv(tmp_path / "watch.csv", readings()), group_column=None)
    assert data.x[:, 0, 0].tolist() == [2, 4, 6, 12, 14, 16]


def test_default_stride_is_the_window(tmp_path: Path) -> None:
    data, _ = load(write_csv(tmp_path / "watch.csv", readings()), stride=None)
    assert data.x[:, 0, 0].tolist() == [2, 5, 12, 16]


def test_non_numeric_and_non_finite_readings_are_bad_rows(tmp_path: Path) -> None:
    rows = readings()
    rows[3 - 2][2] = "abc"
    rows[13 - 2][1] = "inf"
    rows[16 - 2][1] = "1e40"  # beyond float32
    data, report = load(write_csv(tmp_path / "w.csv", rows))
    assert report.dropped["bad_row"] == 5
    assert report.examples["bad_row"] == ["w.csv:3", "w.csv:9", "w.csv:13"]
    assert data.x[:, 0, 0].tolist() == [4, 6]  # walk 4-8 only; every run segment is now short
    assert report.dropped["short_segment"] == 1 + 2 + 1 + 2 + 2  # lines 2, 10-11, 12, 14-15, 17-18


def test_parquet_gives_the_same_arrays_as_csv(tmp_path: Path) -> None:
    from_csv, csv_report = load(write_csv(tmp_path / "w.csv", readings()))
    from_parquet, pq_report = load(write_parquet(tmp_path / "w.parquet", readings()))
    np.testing.assert_array_equal(from_parquet.x, from_csv.x)
    np.testing.assert_array_equal(from_parquet.y, from_csv.y)
    assert pq_report.dropped == csv_report.dropped
    assert pq_report.examples["bad_row"] == ["w.parquet:row 7", "w.parquet:row 17"]


def test_unknown_label_is_refused_with_its_line(tmp_path: Path) -> None:
    rows = readings()
    rows[5 - 2][3] = "swim"
    with pytest.raises(DataSourceError, match=r"w\.csv:5: label 'swim' is not a class.*idle, walk, run"):
        load(write_csv(tmp_path / "w.csv", rows))


@pytest.mark.parametrize("options, column", [
    ({"channels": ("ax", "gz")}, "gz"),
    ({"label_column": "activity"}, "activity"),
    ({"group_column": "session"}, "session"),
])
def test_missing_column_is_refused_with_the_columns_present(tmp_path: Path, options: dict, column: str) -> None:
    for path in (write_csv(tmp_path / "w.csv", readings()), write_parquet(tmp_path / "w.parquet", readings())):
        with pytest.raises(DataSourceError) as info:
            load(path, **options)
        message = str(info.value)
        assert f"no column {column!r}" in message and path.name in message
        assert "['t', 'ax', 'ay', 'label', 'user']" in message


def test_no_windows_at_all_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError, match=r"w\.csv: no window of 8 contiguous rows \(dropped 2 bad_row"):
        load(write_csv(tmp_path / "w.csv", readings()), window=8)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(DataSourceError, match="empty.csv: empty file; a header row"):
        load(empty)
    with pytest.raises(DataSourceError, match="expected a .csv or .parquet"):
        load(write_csv(tmp_path / "w.txt", readings()))
