"""npz archives: the task's label count, not the file's largest label, sets num_classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.data.sources import DataSourceError, load_npz

TEN = tuple(str(d) for d in range(10))


def save(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_skewed_labels_keep_the_declared_label_count(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(20, 6, 7), dtype=np.uint8)
    y = np.arange(20) % 4  # this device only has digits 0..3
    data, report = load_npz(save(tmp_path / "dev.npz", x=x, y=y), TEN)
    assert data.num_classes == 10 and len(data) == 20 and data.name == "dev"
    assert data.x.shape == (20, 1, 6, 7) and data.x.dtype == np.float32
    np.testing.assert_allclose(data.x[:, 0], x / 255.0, atol=1e-7)
    assert data.y.dtype == np.int64 and data.y.tolist() == y.tolist()
    assert report.summary() == "clean"


def test_channels_last_images_are_transposed(tmp_path: Path) -> None:
    x = np.random.default_rng(1).integers(0, 256, size=(5, 8, 9, 3), dtype=np.uint8)
    data, _ = load_npz(save(tmp_path / "rgb.npz", images=x, labels=np.array([0, 1, 2, 1, 0])), ("a", "b", "c"))
    assert data.x.shape == (5, 3, 8, 9)
    np.testing.assert_allclose(data.x[2, 1], x[2, :, :, 1] / 255.0, atol=1e-7)


def test_float_sensor_windows_pass_through_unscaled(tmp_path: Path) -> None:
    x = np.random.default_rng(2).standard_normal((6, 3, 50)).astype(np.float64) * 9.81
    path = save(tmp_path / "imu.npz", x=x, y=np.array([0, 1, 0, 1, 0, 1]))
    data, _ = load_npz(path, ("sit", "walk"), windows=True)
    assert data.x.shape == (6, 3, 50) and data.x.dtype == np.float32
    np.testing.assert_allclose(data.x, x.astype(np.float32))
    as_images, _ = load_npz(path, ("sit", "walk"))  # rank 3 reads as grayscale [N, H, W] by default
    assert as_images.x.shape == (6, 1, 3, 50)
    flat, _ = load_npz(save(tmp_path / "feat.npz", x=x[:, 0], y=np.zeros(6, dtype=np.int64)), ("sit", "walk"))
    assert flat.x.shape == (6, 50)


@pytest.mark.parametrize("bad", [10, -1])
def test_labels_outside_the_label_space_are_refused(tmp_path: Path, bad: int) -> None:
    path = save(tmp_path / "dev.npz", x=np.zeros((3, 4, 4)), y=np.array([0, bad, 2]))
    with pytest.raises(DataSourceError) as info:
        load_npz(path, TEN)
    message = str(info.value)
    assert str(path) in message and f"label {bad} at index 1" in message and "10 classes" in message


def test_missing_keys_and_bad_label_types_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError, match=r"found \['data', 'y'\]"):
        load_npz(save(tmp_path / "a.npz", data=np.zeros((2, 3)), y=np.zeros(2, dtype=int)), TEN)
    with pytest.raises(DataSourceError, match="labels must be integer class indices, got dtype float64"):
        load_npz(save(tmp_path / "b.npz", x=np.zeros((2, 3)), y=np.array([0.5, 1.0])), TEN)
    with pytest.raises(DataSourceError, match="3 inputs but 2 labels"):
        load_npz(save(tmp_path / "c.npz", x=np.zeros((3, 3)), y=np.array([0, 1])), TEN)
    with pytest.raises(DataSourceError, match="range 0..300"):
        load_npz(save(tmp_path / "d.npz", x=np.array([[0, 300]]), y=np.array([1])), TEN)
