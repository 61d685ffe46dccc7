"""n updates of one layout, read in float64 column blocks without ever stacking them whole.

Every rule here looks at the floating values of all updates as one n x d matrix (one row per
update, the arrays concatenated in name order). Materialising it in float64 would take
n * d * 8 bytes (8 GB at n = 100, d = 10M), so rules walk it in column blocks of a fixed
byte budget instead: memory for the working set stays constant in n and d, and the inputs
are read where they lie (contiguous arrays, as decoded from the wire, are never copied).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.aggregation.errors import AggregationError, FailureReason
from coordinator.aggregation.rows import MatrixRow, NamedArrays, RowMatrix

BLOCK_BYTES = 8 * 1024 * 1024
"""Default float64 working set of one block, across all rows."""


def check_weights(updates: Sequence[NamedArrays], weights: Sequence[float]) -> np.ndarray:
    """The weights as float64, after checking them and the updates' shared layout."""
    if not updates:
        raise AggregationError(FailureReason.NO_UPDATES, "nothing to aggregate")
    if len(weights) != len(updates):
        raise AggregationError(FailureReason.BAD_WEIGHTS, f"{len(weights)} weights for {len(updates)} updates")
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise AggregationError(FailureReason.BAD_WEIGHTS, "weights must be finite, non-negative, and not all zero")
    first = updates[0]
    for update in updates[1:]:
        if update.keys() != first.keys() or any(
            update[k].shape != first[k].shape or update[k].dtype != first[k].dtype for k in first
        ):
            raise AggregationError(FailureReason.LAYOUT_MISMATCH, "updates do not share one layout")
    for name, array in first.items():
        if array.dtype.kind == "c":
            raise AggregationError(FailureReason.UNSUPPORTED_DTYPE, f"{name} is complex ({array.dtype})")
    return w


def check_f(f: int) -> None:
    if f < 0:
        raise AggregationError(FailureReason.INVALID_PARAMETER, f"byzantine f must be >= 0, got {f}")


def check_clip_norm(clip_norm: float | None) -> None:
    if clip_norm is not None and not (math.isfinite(clip_norm) and clip_norm > 0):
        raise AggregationError(FailureReason.INVALID_PARAMETER, f"clip_norm must be positive, got {clip_norm}")


@dataclass(frozen=True)
class Block:
    """Columns ``[column, column + stop - start)`` of the block come from ``array[start:stop]``."""

    width: int
    parts: tuple[tuple[int, int, int, int], ...]
    """(float array index, start, stop, column) for each piece."""


class UpdateStack:
    """The updates with positive weight, as rows; float arrays are read block by block.

    Updates of weight zero take no part in any rule (as in a weighted mean, where they
    contribute nothing). With ``clip_norm``, each row is scaled by min(1, clip_norm / norm)
    as it is read, the norm being the L2 norm over all its floating values (in float64).
    """

    def __init__(self, updates: Sequence[NamedArrays], weights: Sequence[float], *,
                 clip_norm: float | None = None, block_bytes: int = BLOCK_BYTES) -> None:
        all_weights = check_weights(updates, weights)
        check_clip_norm(clip_norm)
        self.all_weights = all_weights
        self.positions = np.flatnonzero(all_weights > 0)
        """Where each row came from in the caller's sequence."""
        self.rows: list[NamedArrays] = [updates[i] for i in self.positions]
        self.weights = all_weights[self.positions]
        first = updates[0]
        self.layout = {name: (a.shape, a.dtype) for name, a in first.items()}
        self.float_names = [name for name, a in first.items() if a.dtype.kind == "f"]
        self.other_names = [name for name, a in first.items() if a.dtype.kind != "f"]
        self.block_bytes = block_bytes
        self._sizes = [int(np.prod(first[name].shape, dtype=np.int64)) for name in self.float_names]
        self._matrix, self._matrix_rows = _shared_matrix(self.rows, self.float_names)
        """Rows that live in one RowMatrix are read a block of all rows at a time, with no per-row copy."""
        self._all_in_order = self._matrix is not None and np.array_equal(
            self._matrix_rows, np.arange(self._matrix.count))
        self._flat = [] if self._matrix is not None else [
            [np.ravel(row[name]) for name in self.float_names] for row in self.rows]
        self._starts = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)
        self.scales = np.ones(self.n)
        self.norms: np.ndarray | None = None
        if clip_norm is not None:
            self.norms = self._row_norms()  # read while every scale is still 1.0
            with np.errstate(divide="ignore"):
                self.scales = np.minimum(1.0, clip_norm / self.norms)

    @property
    def scales(self) -> np.ndarray:
        """Factor each row is multiplied by as it is read (1.0 unless clipped)."""
        return np.array(self._scale_list)

    @scales.setter
    def scales(self, values: np.ndarray) -> None:
        self._scale_list = [float(v) for v in values]  # Python floats: compared per row and block

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def exact_in_float32(self) -> bool:
        """Whether every floating value, as read, is a float32 value (float32 or narrower arrays, unclipped)."""
        return all(self.layout[name][1].itemsize <= 4 for name in self.float_names) and all(
            scale == 1.0 for scale in self._scale_list)

    @property
    def columns(self) -> int:
        """Floating values per row (every float array, concatenated)."""
        return int(self._starts[-1])

    def block_width(self, rows: int | None = None, budget: int | None = None) -> int:
        """Columns per block so that ``rows`` float64 rows fit ``budget`` bytes (default: the stack's)."""
        rows = self.n if rows is None else rows
        width = max(256, (budget or self.block_bytes) // (8 * max(rows, 1)))
        return self._matrix.aligned(width) if self._matrix is not None else width

    def blocks(self, width: int | None = None) -> Iterator[Block]:
        """Consecutive column blocks of at most ``width`` values; small arrays share a block."""
        width = width or self.block_width()
        parts: list[tuple[int, int, int, int]] = []
        column = 0
        for index, size in enumerate(self._sizes):
            start = 0
            while start < size:
                take = min(size - start, width - column)
                parts.append((index, start, start + take, column))
                column += take
                start += take
                if column == width:
                    yield Block(column, tuple(parts))
                    parts, column = [], 0
        if parts:
            yield Block(column, tuple(parts))

    def read_rows(self, block: Block, buffer: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        """The block as a contiguous (rows, width) view into ``buffer`` (flat, large enough; float64,
        or float32 where ``exact_in_float32``)."""
        rows = range(self.n) if rows is None else rows
        out = buffer[: len(rows) * block.width].reshape(len(rows), block.width)
        if self._matrix is not None:
            self._matrix.read_block(self._picked(rows), self._first_column(block), out)
            self._scale_block(out, rows)
            return out
        scales = self._scale_list  # multiplied with dtype=float64: a Python float would compute in float32
        if len(block.parts) == 1:  # the common case, kept lean: this loop runs n times per block
            index, start, stop, _ = block.parts[0]
            for r, i in enumerate(rows):
                if scales[i] == 1.0:
                    out[r] = self._flat[i][index][start:stop]
                else:
                    np.multiply(self._flat[i][index][start:stop], scales[i], out=out[r], dtype=np.float64)
            return out
        for r, i in enumerate(rows):
            for index, start, stop, column in block.parts:
                target = out[r, column:column + stop - start]
                if scales[i] == 1.0:
                    target[...] = self._flat[i][index][start:stop]
                else:
                    np.multiply(self._flat[i][index][start:stop], scales[i], out=target, dtype=np.float64)
        return out

    def read_columns(self, block: Block, buffer: np.ndarray) -> np.ndarray:
        """The block transposed, as a contiguous (width, n) float64 view: one row per coordinate."""
        out = buffer[: block.width * self.n].reshape(block.width, self.n)
        if self._matrix is not None:
            self._matrix.read_block(self._picked(range(self.n)), self._first_column(block), out.T)
            self._scale_block(out.T, range(self.n))
            return out
        scales = self._scale_list
        for i in range(self.n):
            for index, start, stop, column in block.parts:
                target = out[column:column + stop - start, i]
                if scales[i] == 1.0:
                    target[...] = self._flat[i][index][start:stop]
                else:
                    np.multiply(self._flat[i][index][start:stop], scales[i], out=target, dtype=np.float64)
        return out

    def _first_column(self, block: Block) -> int:
        index, start, _, _ = block.parts[0]
        return int(self._starts[index]) + start  # blocks are consecutive columns of the concatenation

    def _picked(self, rows: Sequence[int]) -> np.ndarray | None:
        """The matrix's indices of ``rows``; None for all of its rows in order (read as one stretch)."""
        everything = isinstance(rows, range) and len(rows) == self.n
        if everything and self._all_in_order:
            return None
        return self._matrix_rows if everything else self._matrix_rows[list(rows)]

    def _scale_block(self, out: np.ndarray, rows: Sequence[int]) -> None:
        """Clip the rows of ``out`` (float64, one row per update) in place."""
        scales = self.scales[list(rows)]
        if (scales != 1.0).any():
            out *= scales[:, None]

    def _row_norms(self) -> np.ndarray:
        """L2 norm of each row over its floating values, accumulated in float64."""
        squares = np.zeros(self.n)
        buffer = np.empty(self.block_width() * self.n)
        for block in self.blocks():
            rows = self.read_rows(block, buffer)
            squares += np.einsum("ij,ij->i", rows, rows)
        return np.sqrt(squares)

    def new_outputs(self) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """Empty float outputs in the inputs' shapes and dtypes, with flat views to write blocks into."""
        outputs = {name: np.empty(self.layout[name][0], dtype=self.layout[name][1]) for name in self.float_names}
        return outputs, [outputs[name].reshape(-1) for name in self.float_names]

    @staticmethod
    def write(flat_outputs: list[np.ndarray], block: Block, values: np.ndarray) -> None:
        """Scatter one block of float64 results into the outputs (rounded once to their dtype)."""
        for index, start, stop, column in block.parts:
            flat_outputs[index][start:stop] = values[column:column + stop - start]

    def row_copy(self, i: int) -> dict[str, np.ndarray]:
        """Row ``i``'s floating arrays, clipped if configured, in their own dtypes."""
        row, scale = self.rows[i], self.scales[i]
        if scale == 1.0:
            return {name: np.array(row[name], copy=True) for name in self.float_names}
        # float64 product, rounded once (a Python float times float32 would compute in float32)
        return {name: np.multiply(row[name], scale, dtype=np.float64).astype(row[name].dtype, copy=False)
                for name in self.float_names}

    def others_from(self, i: int) -> dict[str, np.ndarray]:
        """Copies of row ``i``'s integer and boolean arrays (never averaged: counts stay counts)."""
        return {name: np.array(self.rows[i][name], copy=True) for name in self.other_names}

    def others_lower_median(self) -> dict[str, np.ndarray]:
        """Integer and boolean arrays as their coordinate-wise lower median over the rows.

        Robust like the float rules (a minority cannot move it) and never a fraction: each
        value is one that some row holds at that coordinate.
        """
        out = {}
        for name in self.other_names:
            stacked = np.stack([np.asarray(row[name]) for row in self.rows])
            middle = np.partition(stacked, (self.n - 1) // 2, axis=0)[(self.n - 1) // 2]
            out[name] = np.array(middle, dtype=stacked.dtype)  # an array even for shape (): never a numpy scalar
        return out

    def in_order(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` in the inputs' name order."""
        return {name: arrays[name] for name in self.layout}


def _shared_matrix(rows: Sequence[NamedArrays], float_names: list[str]) -> tuple[RowMatrix | None, np.ndarray]:
    """The one RowMatrix every row lives in, with the rows' indices in it; (None, empty) otherwise."""
    if not rows or not all(isinstance(row, MatrixRow) for row in rows):
        return None, np.empty(0, dtype=np.int64)
    owner = rows[0].rows  # type: ignore[attr-defined]
    if any(row.rows is not owner for row in rows) or owner.float_names != float_names:  # type: ignore[attr-defined]
        return None, np.empty(0, dtype=np.int64)
    return owner, np.array([row.index for row in rows], dtype=np.int64)  # type: ignore[attr-defined]
