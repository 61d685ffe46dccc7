"""A profile that wants CUDA says so, once, at WARNING, when it has to train on the CPU instead."""

from __future__ import annotations

import logging
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
