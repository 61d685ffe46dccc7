"""Sensor readings in a table (CSV or Parquet, one row per time step) cut into labelled windows.

A window never spans a label change, a group change (another recording or person) or a
dropped row, so every window is a real contiguous stretch of one activity.
"""

from __future__ import annotations

import csv
import math
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources.label_space import class_index, known
from edge_agent.data.sources.registry import SOURCES, DataSource, SourceRequest
from edge_agent.data.sources.report import DataSourceError, LoadReport

FLOAT32_MAX = float(np.finfo(np.float32).max)
# (location within the file, channel values, label, group value)
Row = tuple[str, Sequence[object], object, object]


def _require(path: Path, have: Sequence[str], needed: Sequence[str]) -> None:
    for column in needed:
        if column not in have:
            raise DataSourceError(f"{path}: no column {column!r}; the file has columns {list(have)} "
                                  "(fix the task's channels/label_column/group_column or the file's header)")


def _cell(row: list[str], i: int) -> str:
    return row[i] if i < len(row) else ""  # a short row reads as empty cells, hence a bad row


def _csv_rows(path: Path, channels: Sequence[str], label: str, group: str | None) -> Iterator[Row]:
    """Stream rows; locations are physical line numbers with the header as line 1."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise DataSourceError(f"{path}: empty file; a header row naming the columns is required")
        _require(path, header, [*channels, label, *([group] if group else [])])
        col = {name: i for i, name in reversed(list(enumerate(header)))}
        chan_idx = [col[c] for c in channels]
        label_idx, group_idx = col[label], (col[group] if group else None)
        for row in reader:
            if not row:
                continue
            yield (str(reader.line_num), [_cell(row, i) for i in chan_idx], _cell(row, label_idx),
                   None if group_idx is None else _cell(row, group_idx))


def _parquet_rows(path: Path, channels: Sequence[str], label: str, group: str | None) -> Iterator[Row]:
    """Stream record batches; locations are 0-based row indices, as pandas/pyarrow count them."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataSourceError(f"{path}: reading Parquet needs pyarrow; pip install pyarrow") from exc
    parquet = pq.ParquetFile(path)
    needed = list(dict.fromkeys([*channels, label, *([group] if group else [])]))
    _require(path, parquet.schema_arrow.names, needed)
    n = 0
    for batch in parquet.iter_batches(columns=needed):
        cols = {name: batch.column(name).to_pylist() for name in needed}
        for i in range(batch.num_rows):
            yield (f"row {n}", [cols[c][i] for c in channels], cols[label][i], cols[group][i] if group else None)
            n += 1


def _numbers(values: Sequence[object]) -> list[float] | None:
    """The row's channel values, or None if any is empty, non-numeric or not a finite float32."""
    out = []
    for v in values:
        try:
            f = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        if not (math.isfinite(f) and abs(f) <= FLOAT32_MAX):
            return None
        out.append(f)
    return out


def load_sensor_windows(path: Path, classes: Sequence[str], *, channels: Sequence[str], window: int,
                        stride: int | None = None, label_column: str = "label", group_column: str | None = None,
                        name: str | None = None) -> tuple[Dataset, LoadReport]:
    """Cut ``window``-row windows every ``stride`` rows into float32 [N, len(channels), window].

    Bad rows are dropped and break their segment; an undeclared label is a configuration
    error, so it raises rather than being skipped.
    """
    path = Path(path)
    index = class_index(classes)
    stride = window if stride is None else stride
    if window < 1 or stride < 1 or not channels or isinstance(channels, str):
        raise DataSourceError(f"{path}: need window >= 1, stride >= 1 and a list of channel columns, "
                              f"got window={window}, stride={stride}, channels={channels!r}")
    if not path.is_file():
        raise DataSourceError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        rows = _csv_rows(path, channels, label_column, group_column)
    elif suffix in (".parquet", ".pq"):
        rows = _parquet_rows(path, channels, label_column, group_column)
    else:
        raise DataSourceError(f"{path}: expected a .csv or .parquet file")

    report = LoadReport()
    flat = array("f")  # every kept row's channel values, row after row
    segments: list[tuple[int, int, int, str, str]] = []  # (first row, rows, label, first loc, last loc)
    key: tuple[int, object] | None = None
    start, first, last = 0, "", ""

    def close() -> None:
        nonlocal key, start
        if key is not None:
            segments.append((start, len(flat) // len(channels) - start, key[0], first, last))
        key, start = None, len(flat) // len(channels)

    for loc, values, label, group in rows:
        text = "" if label is None else str(label).strip()
        numbers = _numbers(values) if text else None
        if text and text not in index:
            raise DataSourceError(f"{path.name}:{loc}: label {text!r} is not a class of this task "
                                  f"(known classes: {known(classes)}); fix the file or the task's classes")
        if numbers is None:
            close()
            report.drop("bad_row", f"{path.name}:{loc}")
            continue
        if key != (index[text], group):
            close()
            key, first = (index[text], group), loc
        flat.extend(numbers)
        last = loc
    close()

    data = np.frombuffer(flat, dtype=np.float32).reshape(-1, len(channels))
    xs, ys = [], []
    for begin, count, label_id, first_loc, last_loc in segments:
        if count < window:
            report.drop("short_segment", f"{path.name}:{first_loc}-{last_loc}", count)
            continue
        cut = sliding_window_view(data[begin:begin + count], window, axis=0)[::stride]  # [k, C, window]
        xs.append(cut)
        ys.append(np.full(len(cut), label_id, dtype=np.int64))
    if not xs:
        raise DataSourceError(f"{path}: no window of {window} contiguous rows ({report.summary()}); "
                              "check the file or use a smaller window")
    x = np.ascontiguousarray(np.concatenate(xs), dtype=np.float32)
    return Dataset(x, np.concatenate(ys), len(classes), name or path.stem), report


def _is_table(source: str) -> bool:
    path = Path(source)
    return path.suffix in (".csv", ".parquet") and path.is_file()


def _load_table(source: str, request: SourceRequest) -> tuple[Dataset, LoadReport]:
    shape = request.shape
    return load_sensor_windows(Path(source), request.classes, channels=shape["columns"], window=shape["window"],
                               stride=shape["stride"])


SOURCES.register(
    "sensor_windows", DataSource(_is_table, _load_table, form="an existing .csv or .parquet file"),
    summary="sensor readings in a CSV or Parquet table (a row a time step, a label column), cut into windows",
    kinds=("windows",))
