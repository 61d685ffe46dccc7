"""Draw a folder of shape images per device: ``python -m shapes_task.make_data OUT --devices 3``."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from PIL import Image, ImageDraw

from shapes_task import CLASSES


def draw(shape: str, rng: random.Random, size: int = 32) -> Image.Image:
    image = Image.new("L", (size, size), color=rng.randint(0, 60))
    pen = ImageDraw.Draw(image)
    r = rng.randint(size // 5, size // 3)
    cx, cy = rng.randint(r + 1, size - r - 2), rng.randint(r + 1, size - r - 2)
    ink = rng.randint(170, 255)
    if shape == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), outline=ink, width=2)
    elif shape == "square":
        pen.rectangle((cx - r, cy - r, cx + r, cy + r), outline=ink, width=2)
    elif shape == "triangle":
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], outline=ink, width=2)
    else:
        pen.line((cx - r, cy - r, cx + r, cy + r), fill=ink, width=2)
        pen.line((cx - r, cy + r, cx + r, cy - r), fill=ink, width=2)
    return image


def make_device_folder(root: Path, per_class: int, seed: int) -> Path:
    rng = random.Random(seed)
    for shape in CLASSES:
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            draw(shape, rng).save(folder / f"{shape}-{i:04d}.png")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=40)
    args = parser.parse_args()
    for device in range(args.devices):
        print(make_device_folder(args.out / f"device-{device}", args.per_class, seed=device))


if __name__ == "__main__":
    main()
