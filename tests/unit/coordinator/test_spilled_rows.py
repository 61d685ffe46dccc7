"""Rows of a spilled matrix are staged in groups before they go into the file; every row reads back the same,
whether its group was written or is still staged, and interleaved with further appends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.aggregation.rows import SPILL_GROUP, TILE_COLUMNS, RowMatrix

WIDTH = 3 * TILE_COLUMNS + 17  # a partial last tile


def update(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {"w": rng.normal(size=(WIDTH - 7,)).astype(np.float32), "b": rng.normal(size=7).astype(np.float32),
            "steps": np.array([i], np.int64)}


@pytest.mark.parametrize("count", [1, SPILL_GROUP - 1, SPILL_GROUP, 2 * SPILL_GROUP + 5])
def test_staged_and_written_rows_read_back_exactly(tmp_path: Path, count: int) -> None:
    spilled = RowMatrix(update(0), count + 3, budget_bytes=0, spill_dir=tmp_path)
    memory = RowMatrix(update(0), count + 3, budget_bytes=1 << 30, spill_dir=None)
    assert spilled.spilled and not memory.spilled
    kept = []
    for i in range(count):
        kept.append(spilled.append(update(i)))
        memory.append(update(i))
        if i % 7 == 3:  # a read in the middle of a group writes what is staged; appending carries on after it
            assert np.array_equal(kept[i]["w"], update(i)["w"])
    # blocks first: nothing but read_block itself writes the rows still staged
    for first, width in ((0, WIDTH), (TILE_COLUMNS - 5, TILE_COLUMNS + 9), (WIDTH - 3, 3)):
        got, want = np.empty((count, width), np.float64), np.empty((count, width), np.float64)
        spilled.read_block(None, first, got)
        memory.read_block(None, first, want)
        assert np.array_equal(got, want), (first, width)
    picked = np.array([count - 1, 0])
    got, want = np.empty((2, 40), np.float32), np.empty((2, 40), np.float32)
    spilled.read_block(picked, 10, got)
    memory.read_block(picked, 10, want)
    assert np.array_equal(got, want)
    for i, row in enumerate(kept):
        for name, array in update(i).items():
            assert np.array_equal(row[name], array), (i, name)
    spilled.close()
    memory.close()
