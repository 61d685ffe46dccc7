"""Device profiles: what each class of device trains, and how."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    family: str
    batch_size: int
    threads: int
    """torch intra-op threads; 0 keeps torch's default."""
    accelerator: Literal["cuda", "cpu"]
    """Preferred; falls back to the CPU where CUDA is absent."""

    def torch_device(self) -> torch.device:
        if self.accelerator == "cuda" and torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")


PROFILES: dict[str, DeviceProfile] = {
    "jetson": DeviceProfile("jetson", "cnn_large", batch_size=64, threads=4, accelerator="cuda"),
    "rpi": DeviceProfile("rpi", "cnn_small", batch_size=32, threads=2, accelerator="cpu"),
    "phone": DeviceProfile("phone", "mlp_tiny", batch_size=16, threads=1, accelerator="cpu"),
    "cpu": DeviceProfile("cpu", "cnn_large", batch_size=64, threads=0, accelerator="cpu"),
}


def get_profile(name: str) -> DeviceProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]
