"""Image folders: declared label space, sorted visiting, corrupt files dropped, layout mistakes refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_agent.data.sources import DataSourceError, load_image_folder

CLASSES = ("cat", "dog", "bird")


def write_image(path: Path, value: int, size: tuple[int, int] = (12, 10), mode: str = "L", fmt: str = "PNG") -> None:
    """A uniform image (W, H = size) so the decoded, resized pixels are known exactly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    color = value if mode == "L" else (value, 0, 255 - value)
    Image.new(mode, size, color).save(path, fmt)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    write_image(root / "cat" / "b.png", 51)
    write_image(root / "cat" / "a.png", 255)
    write_image(root / "cat" / ".hidden.png", 0)
    write_image(root / "dog" / "x.jpg", 102, fmt="JPEG", mode="RGB")
    (root / "bird").mkdir()  # empty: this device has no birds
    write_image(root / "dog" / "y.png", 0)
    noise = np.random.default_rng(0).integers(0, 256, size=(10, 12), dtype=np.uint8)
    Image.fromarray(noise).save(root / "dog" / "z_truncated.png")
    whole = (root / "dog" / "z_truncated.png").read_bytes()
    (root / "dog" / "z_truncated.png").write_bytes(whole[: len(whole) // 2])  # header intact, pixels cut off
    (root / "cat" / "notes.png").write_text("not an image at all")
    return root


def test_loads_in_sorted_order_with_declared_labels(folder: Path) -> None:
    data, report = load_image_folder(folder, CLASSES, size=(4, 5), name="cam")
    assert data.x.shape == (4, 1, 4, 5) and data.x.dtype == np.float32
    assert data.y.tolist() == [0, 0, 1, 1]  # cat/a, cat/b, dog/x, dog/y
    assert data.num_classes == 3 and data.name == "cam"
    np.testing.assert_allclose(data.x[0], 1.0)
    np.testing.assert_allclose(data.x[1], 51 / 255, atol=1e-6)
    np.testing.assert_allclose(data.x[3], 0.0)
    assert 0.0 <= data.x.min() and data.x.max() <= 1.0


def test_corrupt_files_are_dropped_and_named(folder: Path) -> None:
    with Image.open(folder / "dog" / "z_truncated.png") as img:
        assert img.size == (12, 10)  # opens fine: only decoding the pixels fails
    _, report = load_image_folder(folder, CLASSES, size=(4, 5))
    assert report.dropped == {"corrupt_image": 2}
    assert report.examples["corrupt_image"] == ["notes.png", "z_truncated.png"]
    assert report.warnings == [f"{folder}: no images for 1 of 3 classes: bird"]
    assert report.summary() == "dropped 2 corrupt_image (notes.png, z_truncated.png); 1 warning"


def test_rgb_output_is_channel_first(folder: Path) -> None:
    data, _ = load_image_folder(folder, CLASSES, size=(3, 3), channels=3)
    assert data.x.shape == (4, 3, 3, 3)
    np.testing.assert_allclose(data.x[0], 1.0)  # gray 255 -> white in every channel
    dog_jpeg = data.x[2]
    assert dog_jpeg[0].mean() > dog_jpeg[1].mean() + 0.3  # red 102 vs green 0 survives JPEG
    assert dog_jpeg[2].mean() > dog_jpeg[0].mean()  # blue 153 is the strongest


def test_missing_class_folder_is_a_warning_not_an_error(tmp_path: Path) -> None:
    write_image(tmp_path / "dog" / "a.png", 10)
    data, report = load_image_folder(tmp_path, CLASSES, size=(2, 2))
    assert data.y.tolist() == [1] and data.num_classes == 3
    assert report.warnings == [f"{tmp_path}: no images for 2 of 3 classes: cat, bird"]


def test_unknown_class_folder_is_refused(folder: Path) -> None:
    write_image(folder / "horse" / "h.png", 10)
    with pytest.raises(DataSourceError, match=r"horse.*not a class of this task.*known classes: cat, dog, bird"):
        load_image_folder(folder, CLASSES, size=(4, 4))


def test_no_readable_images_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "broken.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(DataSourceError, match=r"no readable images \(dropped 1 corrupt_image \(broken.png\)\)"):
        load_image_folder(tmp_path, CLASSES, size=(4, 4))
    with pytest.raises(DataSourceError, match="not a folder"):
        load_image_folder(tmp_path / "absent", CLASSES, size=(4, 4))


def test_channels_other_than_one_or_three_are_refused(folder: Path) -> None:
    with pytest.raises(DataSourceError, match="channels must be 1 .* or 3 .*got 4"):
        load_image_folder(folder, CLASSES, size=(4, 4), channels=4)
