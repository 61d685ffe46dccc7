"""A round's in-memory row matrix is kept for the next round of the same shape (no page faults on the way
in), but never while a view of its rows survives: a past round's view must not see the next round's rows."""

from __future__ import annotations

import numpy as np

from coordinator.aggregation.rows import RowMatrix

TEMPLATE = {"w": np.zeros((4, 5), np.float32), "b": np.zeros(5, np.float32)}


def matrix_of(values: float, rows: int = 3) -> tuple[RowMatrix, list]:
    matrix = RowMatrix(TEMPLATE, 8, budget_bytes=1 << 30, spill_dir=None)
    kept = [matrix.append({"w": np.full((4, 5), values + i, np.float32), "b": np.full(5, values, np.float32)})
            for i in range(rows)]
    return matrix, kept


def test_the_next_round_reuses_the_last_rounds_memory() -> None:
    first, _ = matrix_of(1.0)
    address = first.matrix.ctypes.data
    first.close()
    second, kept = matrix_of(7.0, rows=2)
    assert second.matrix.ctypes.data == address
    assert second.count == 2
    np.testing.assert_array_equal(kept[1]["w"], np.full((4, 5), 8.0, np.float32))
    second.close()
    other_shape = RowMatrix(TEMPLATE, 9, budget_bytes=1 << 30, spill_dir=None)
    assert other_shape.matrix.shape == (9, 25)


def test_a_surviving_view_of_the_last_round_keeps_its_rows() -> None:
    first, kept = matrix_of(1.0)
    address = first.matrix.ctypes.data
    view = kept[2]["w"]  # a view into the matrix, held past the round
    first.close()
    second, _ = matrix_of(7.0)
    assert second.matrix.ctypes.data != address
    np.testing.assert_array_equal(view, np.full((4, 5), 3.0, np.float32))
    second.close()
