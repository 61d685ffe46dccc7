"""Updates of one layout as rows of one matrix, written as they arrive; on disk beyond a budget.

Robust rules (median, trimmed mean, Krum) need every update at the close, unlike the mean.
Keeping them as decoded messages costs more than their arrays (each payload, plus copies),
and reading them block by block took one Python-level copy per row and block, which grew
faster than linearly with the fleet. Here each update's floating values are copied once,
on receipt, into row i of an (capacity, width) matrix: in memory while the round's rows fit
the memory budget, else in a memory-mapped file that the kernel pages in and out. The
aggregation stack then reads a column block of all rows with one vectorised copy.

A spilled file is laid out in tiles of ``TILE_COLUMNS`` columns, column-block-major: tile t
holds columns [t * TILE_COLUMNS, (t + 1) * TILE_COLUMNS) of every row, row after row. Rules
read a column block of all rows at a time, so a block is a few contiguous stretches of the
file (read ahead sequentially), not one page per row. Row-major, each block of 10,000 rows x
127k values (5 GB) touched 10,000 scattered pages: cheap while the file sat in the page
cache, one disk read per row and block once it did not (a round at that size never
finished). Rows go into the file ``SPILL_GROUP`` at a time (staged in memory, written before
any read), so each tile gets one stretch of whole pages: written a row at a time, a page shared
by four rows was faulted in and dirtied again by each, and at 10,000 rows x 127k a median
round spent 29-32 s collecting; in groups 22.6-23.1 s (2026-12-05).
"""

from __future__ import annotations

import logging
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

NamedArrays = Mapping[str, np.ndarray]
"""One update: array name -> array. Defined here, the lower layer: stack.py reads these rows and imports it."""

log = logging.getLogger(__name__)

TILE_COLUMNS = 256
"""Columns per tile of a spilled file (1 KB a row in float32): the stack's column blocks are
multiples of it, so at 10,000 rows one block is one 10 MB stretch of the file."""


SPILL_GROUP = 16
"""Rows staged in memory before they go into a spilled file together: 16 rows of a tile are 16 KB, whole pages,
so each page of the file is dirtied (faulted in, written back) once, not once per row that shares it."""


class RowMatrix:
    """Up to ``capacity`` updates of the layout of ``template``, floating values as matrix rows."""

    def __init__(self, template: NamedArrays, capacity: int, *, budget_bytes: int, spill_dir: Path | None) -> None:
        self.layout = {name: (a.shape, a.dtype) for name, a in template.items()}
        self.float_names = [name for name, a in template.items() if a.dtype.kind == "f"]
        floats = [template[name] for name in self.float_names]
        self.dtype = np.result_type(*floats) if floats else np.dtype(np.float32)
        self.offsets: dict[str, tuple[int, int]] = {}
        width = 0
        for name, array in zip(self.float_names, floats, strict=True):
            self.offsets[name] = (width, width + array.size)
            width += array.size
        self.width = width
        self.capacity = capacity
        self.count = 0
        self.tiles = -(-max(width, 1) // TILE_COLUMNS)
        nbytes = capacity * max(width, 1) * self.dtype.itemsize
        self._file = None
        self.spilled = nbytes > budget_bytes and spill_dir is not None
        if self.spilled:
            assert spill_dir is not None
            spill_dir.mkdir(parents=True, exist_ok=True)
            self._file = tempfile.NamedTemporaryFile(dir=spill_dir, prefix="rows-", suffix=".f32")  # noqa: SIM115
            self.matrix = np.memmap(self._file, dtype=self.dtype, mode="w+", shape=(self.tiles, capacity, TILE_COLUMNS))
            self._staged = np.zeros((SPILL_GROUP, self.tiles * TILE_COLUMNS), dtype=self.dtype)  # padding stays zero
            self._staged_from = 0
            """The row index of ``_staged[0]``: rows from it to ``count`` are staged, not yet in the file."""
            log.info("%d rows of %d values (%.0f MB) exceed the %.0f MB memory budget: spilling to %s",
                     capacity, width, nbytes / 1e6, budget_bytes / 1e6, self._file.name)
        else:
            self.matrix = _spare_or_new((capacity, max(width, 1)), self.dtype)

    def append(self, arrays: NamedArrays) -> MatrixRow:
        """Copy ``arrays`` (of this layout) in as the next row."""
        if self.count >= self.capacity:
            raise ValueError(f"more than {self.capacity} rows")
        row = self._staged[self.count - self._staged_from] if self.spilled else self.matrix[self.count]
        for name, (start, stop) in self.offsets.items():
            row[start:stop] = np.ravel(arrays[name])
        others = {name: np.array(a, copy=True) for name, a in arrays.items() if a.dtype.kind != "f"}
        self.count += 1
        if self.spilled and self.count - self._staged_from == SPILL_GROUP:
            self._flush()
        return MatrixRow(self, self.count - 1, others)

    def _flush(self) -> None:
        """Write the staged rows into the spilled file: per tile, one stretch of whole pages."""
        staged = self.count - self._staged_from
        if staged:
            self.matrix[:, self._staged_from:self.count, :] = (
                self._staged[:staged].reshape(staged, self.tiles, TILE_COLUMNS).transpose(1, 0, 2))
            self._staged_from = self.count

    def aligned(self, width: int) -> int:
        """``width`` rounded up to whole tiles when spilled (a block then reads whole stretches)."""
        return -(-width // TILE_COLUMNS) * TILE_COLUMNS if self.spilled else width

    def read_block(self, rows: np.ndarray | None, first: int, out: np.ndarray) -> None:
        """Copy columns [first, first + out.shape[1]) of ``rows`` (indices; None: rows 0..count-1) into
        ``out`` (one row per row read; any dtype and strides, e.g. a transposed view)."""
        width = out.shape[1]
        picked: slice | np.ndarray = slice(0, self.count) if rows is None else rows
        if not self.spilled:
            np.copyto(out, self.matrix[picked, first:first + width])
            return
        self._flush()
        for tile in range(first // TILE_COLUMNS, (first + width - 1) // TILE_COLUMNS + 1):
            start = max(first, tile * TILE_COLUMNS)
            stop = min(first + width, (tile + 1) * TILE_COLUMNS)
            offset = tile * TILE_COLUMNS
            np.copyto(out[:, start - first:stop - first], self.matrix[tile, picked, start - offset:stop - offset])

    def row_values(self, index: int, start: int, stop: int) -> np.ndarray:
        """Columns [start, stop) of row ``index``: a view in memory, a copy from a spilled file."""
        if not self.spilled:
            return self.matrix[index, start:stop]
        self._flush()
        first, last = start // TILE_COLUMNS, (max(stop, start + 1) - 1) // TILE_COLUMNS
        pieces = self.matrix[first:last + 1, index, :].reshape(-1)
        return pieces[start - first * TILE_COLUMNS:stop - first * TILE_COLUMNS]

    def close(self) -> None:
        """Let the rows go (the spill file is deleted; memory is kept as the next round's spare)."""
        if not self.spilled:
            _keep_spare(self.matrix)
        self.matrix = np.empty((0, max(self.width, 1)), dtype=self.dtype)
        if self._file is not None:
            self._file.close()
            self._file = None


_spare: list[np.ndarray] = []
"""The last round's in-memory matrix, kept for the next round of the same shape: a fresh one pays a page
fault per 4 KB as rows arrive (about 1 ms per 508 KB row here, a second of a 1,000-agent round)."""


def _spare_or_new(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """The spare matrix if it has this shape and dtype and nothing else refers to it, else a new one."""
    if _spare and _spare[0].shape == shape and _spare[0].dtype == dtype:
        matrix = _spare.pop()
        # Only the list's reference (gone now), this name and getrefcount's argument: no view of a past
        # round's rows survives anywhere, so none can see this round's.
        if sys.getrefcount(matrix) <= 2:
            return matrix
    _spare.clear()
    return np.empty(shape, dtype=dtype)  # pages are committed as rows arrive


def _keep_spare(matrix: np.ndarray) -> None:
    if matrix.size > 1 and matrix.base is None:
        _spare[:] = [matrix]


class MatrixRow(Mapping[str, np.ndarray]):
    """One update as named arrays: floating ones are views of its row (read-only), others its own copies."""

    def __init__(self, rows: RowMatrix, index: int, others: dict[str, np.ndarray]) -> None:
        self.rows = rows
        self.index = index
        self._others = others

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._others:
            return self._others[name]
        start, stop = self.rows.offsets[name]
        shape, dtype = self.rows.layout[name]
        view = self.rows.row_values(self.index, start, stop).reshape(shape)
        view = view if view.dtype == dtype else view.astype(dtype)
        view.flags.writeable = False
        return view

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows.layout)

    def __len__(self) -> int:
        return len(self.rows.layout)
