"""Device profiles: how each class of device trains (what it trains is its task's choice:
``Task.device_families`` maps a profile to a model family)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch

log = logging.getLogger(__name__)

_warned_no_cuda: set[str] = set()
"""Profiles already warned about missing CUDA: once per process, however many agents it runs."""


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    batch_size: int
    threads: int
    """torch intra-op threads; 0 keeps torch's default."""
    accelerator: Literal["cuda", "cpu"]
    """Preferred; falls back to the CPU where CUDA is absent."""

    def torch_device(self) -> torch.device:
        if self.accelerator == "cuda":
            if torch.cuda.is_available():
                return torch.device("cuda")
            if self.name not in _warned_no_cuda:  # a device meant to use its GPU is much slower without it
                _warned_no_cuda.add(self.name)
                log.warning("device %s: CUDA is not available; training on CPU", self.name)
        return torch.device("cpu")


def set_tf32(enabled: bool) -> None:
    """Whether CUDA convolutions and matrix products may round their inputs to TF32 (Ampere and later, Jetson
    Orin included), for this whole process. Off, a GPU's round matches the same round on a CPU to float32
    rounding (a relative distance near 1e-6 after 20 steps, measured on an H200); on (cuDNN's default for
    convolutions), the first step already differs by about 0.6% and 20 steps by about 24%, since each
    product keeps 10 mantissa bits. ``bench/device_rounds.py`` times both."""
    torch.backends.cudnn.allow_tf32 = enabled
    torch.backends.cuda.matmul.allow_tf32 = enabled


_agents_tf32: bool | None = None
"""What the first agent on CUDA in this process set; the flags are torch's, one pair per process."""


def claim_tf32(enabled: bool) -> None:
    """``set_tf32`` for an agent about to train on CUDA. Agents sharing a process share the flags, so they must
    agree: one with TF32 on would otherwise turn it on under another's DP-SGD, which refuses it."""
    global _agents_tf32
    if _agents_tf32 is not None and _agents_tf32 != enabled:
        raise ValueError(f"tf32 {'on' if enabled else 'off'} for this agent, {'on' if _agents_tf32 else 'off'} for "
                         "another agent in this process: torch has one TF32 setting per process")
    _agents_tf32 = enabled
    set_tf32(enabled)


PROFILES: dict[str, DeviceProfile] = {
    "jetson": DeviceProfile("jetson", batch_size=64, threads=4, accelerator="cuda"),
    "rpi": DeviceProfile("rpi", batch_size=32, threads=2, accelerator="cpu"),
    "phone": DeviceProfile("phone", batch_size=16, threads=1, accelerator="cpu"),
    "cpu": DeviceProfile("cpu", batch_size=64, threads=0, accelerator="cpu"),
}


def get_profile(name: str) -> DeviceProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(PROFILES)}")
    return PROFILES[name]
