"""A profile that wants CUDA says so, once, at WARNING, when it has to train on the CPU instead; on CUDA an agent
sets TF32 as configured."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from edge_agent import profiles
from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings

NO_CUDA = "device jetson: CUDA is not available; training on CPU"


@pytest.fixture
def without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without CUDA (this may run on one with a GPU), in a process that has not warned yet."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(profiles, "_warned_no_cuda", set())


def warnings_about_cuda(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "CUDA" in r.getMessage()]


@pytest.mark.usefixtures("without_cuda")
def test_jetson_without_cuda_warns_once_and_trains_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent")
    jetson = profiles.get_profile("jetson")
    assert jetson.torch_device() == torch.device("cpu")
    assert jetson.torch_device() == torch.device("cpu")  # a second agent in the same process
    records = warnings_about_cuda(caplog)
    assert [(r.levelno, r.getMessage()) for r in records] == [(logging.WARNING, NO_CUDA)]


@pytest.mark.usefixtures("without_cuda")
def test_cpu_profiles_never_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent")
    for name in ("rpi", "phone", "cpu"):
        assert profiles.get_profile(name).torch_device() == torch.device("cpu")
    assert warnings_about_cuda(caplog) == []


@pytest.mark.usefixtures("without_cuda")
def test_agent_started_as_jetson_without_cuda_warns(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """The path ``edge-agent run --device jetson`` takes: the agent builds, on the CPU, and the log says why."""
    caplog.set_level(logging.INFO, logger="edge_agent")
    agent = build_agent(AgentSettings(device="jetson", agent_id="j0", state_dir=tmp_path), set_threads=False)
    assert agent.worker.device == torch.device("cpu")
    assert [(r.levelno, r.getMessage()) for r in warnings_about_cuda(caplog)] == [(logging.WARNING, NO_CUDA)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_jetson_with_cuda_uses_it_silently(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent")
    assert profiles.get_profile("jetson").torch_device() == torch.device("cuda")
    assert warnings_about_cuda(caplog) == []


@pytest.fixture
def tf32_flags(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch's process-wide TF32 flags, restored afterwards (monkeypatch cannot set the cuBLAS one), in a
    process where no agent has claimed them yet."""
    monkeypatch.setattr(profiles, "_agents_tf32", None)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.usefixtures("tf32_flags")
@pytest.mark.parametrize("tf32", [False, True])
def test_an_agent_bound_for_cuda_sets_tf32_as_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         tf32: bool) -> None:
    """Off by default, so a Jetson's update matches a CPU's (``profiles.set_tf32``); the flags are torch's own.
    CUDA is only claimed here: building an agent allocates nothing on the device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = not tf32
    agent = build_agent(AgentSettings(device="jetson", agent_id="j0", state_dir=tmp_path, tf32=tf32),
                        set_threads=False)
    assert agent.worker.device == torch.device("cuda")
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert torch.backends.cuda.matmul.allow_tf32 is tf32


@pytest.mark.usefixtures("tf32_flags")
def test_agents_sharing_a_process_must_agree_on_tf32(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One flag pair per process: an agent with TF32 on would turn it on under another's DP-SGD."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    build_agent(AgentSettings(device="jetson", agent_id="j0", state_dir=tmp_path / "j0", dp=True,
                              dp_noise_multiplier=1.0), set_threads=False)
    with pytest.raises(ValueError, match="tf32 on for this agent, off for another agent in this process"):
        build_agent(AgentSettings(device="jetson", agent_id="j1", state_dir=tmp_path / "j1", tf32=True),
                    set_threads=False)
    build_agent(AgentSettings(device="jetson", agent_id="j2", state_dir=tmp_path / "j2"), set_threads=False)
    assert torch.backends.cudnn.allow_tf32 is False


@pytest.mark.usefixtures("without_cuda", "tf32_flags")
def test_an_agent_on_the_cpu_leaves_tf32_alone(tmp_path: Path) -> None:
    torch.backends.cudnn.allow_tf32 = True
    build_agent(AgentSettings(device="jetson", agent_id="j0", state_dir=tmp_path), set_threads=False)
    assert torch.backends.cudnn.allow_tf32 is True
