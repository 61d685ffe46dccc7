"""BasicMotions read from sktime's bundled .ts files (never importing sktime), and cut into windows."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from edge_agent.data.sources import (
    BASIC_MOTIONS_CLASSES,
    DataSourceError,
    basic_motions_dir,
    load_basic_motions,
    motion_windows,
    read_ts,
)

pytest.importorskip("sktime", reason="BasicMotions ships inside sktime")  # find_spec only; see the last test


@pytest.mark.parametrize("split", ["train", "test"])
def test_each_split_has_ten_recordings_per_activity(split: str) -> None:
    x, labels = load_basic_motions(split)  # type: ignore[arg-type]
    assert x.shape == (40, 6, 100) and x.dtype == np.float32
    assert Counter(labels) == dict.fromkeys(BASIC_MOTIONS_CLASSES, 10)
    assert np.isfinite(x).all() and x.std() > 0.1


def test_first_value_matches_the_file() -> None:
    x, labels = load_basic_motions("train")
    first = (basic_motions_dir() / "BasicMotions_TRAIN.ts").read_text().split("@data", 1)[1].split()[0]
    assert x[0, 0, 0] == np.float32(first.split(",")[0])
    assert labels[0] == first.rsplit(":", 1)[1].lower()


def test_windows_stay_within_recordings() -> None:
    x, labels = load_basic_motions("test")
    data = motion_windows(x, labels, BASIC_MOTIONS_CLASSES, window=50, stride=10)
    assert data.x.shape == (40 * 6, 6, 50) and data.num_classes == 4
    np.testing.assert_array_equal(data.x[7], x[1, :, 10:60])  # recording 1, second window
    assert data.y[6:12].tolist() == [BASIC_MOTIONS_CLASSES.index(labels[1])] * 6
    assert np.bincount(data.y).tolist() == [60, 60, 60, 60]


def test_unknown_labels_and_oversized_windows_are_refused() -> None:
    x, labels = load_basic_motions("train")
    with pytest.raises(DataSourceError, match=r"labels \['badminton'\] are not classes"):
        motion_windows(x, labels, ("standing", "walking", "running"))
    with pytest.raises(DataSourceError, match="window=101"):
        motion_windows(x, labels, BASIC_MOTIONS_CLASSES, window=101)


def test_ts_parser_and_missing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ts = tmp_path / "toy.ts"
    ts.write_text("# comment\n@problemName toy\n@data\n1,2,3:4,5,6:A\n7,8,9:1,1,1:B\n")
    x, labels = read_ts(ts)
    assert x.shape == (2, 2, 3) and x[1, 0].tolist() == [7, 8, 9] and labels == ["A", "B"]
    monkeypatch.setattr("edge_agent.data.sources.basic_motions._PACKAGES", ("no_such_pkg_xyz",))
    with pytest.raises(DataSourceError, match="pip install sktime"):
        load_basic_motions("train")


def test_loading_never_imports_sktime() -> None:
    code = ("import sys; from edge_agent.data.sources import load_basic_motions; load_basic_motions('train'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sktime', 'aeon')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                            cwd=Path(__file__).resolve().parents[4])
    assert result.stdout.strip() == "[]"
