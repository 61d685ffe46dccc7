"""What an agent's status says about its data: the label histogram, and when it leaves it out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_agent.agent import EdgeAgent
from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings
from edge_agent.data.datasets import Dataset
from edge_agent.data.local import build_local_data
from edge_agent.profiles import get_profile
from edge_agent.state import AgentStateDir
from edge_agent.tasks import Task
from edge_agent.worker import LocalWorker
from protocol.messages import AgentStatus
from protocol.transport.mqtt import BrokerAddress
from protocol.wire import decode_message, encode_message
from tests.unit.edge_agent.rounds import digits_subset, make_worker


def agent_of(worker: LocalWorker, tmp_path: Path) -> EdgeAgent:
    return EdgeAgent("a0", "t", BrokerAddress("localhost", 1883), get_profile("rpi"), worker,
                     AgentStateDir(tmp_path / "agent"))


def test_status_carries_the_training_label_histogram(tmp_path: Path) -> None:
    data = digits_subset(classes=[1, 4, 7], per_class=5)
    agent = agent_of(make_worker(tmp_path / "w", data), tmp_path)
    status = agent.status()
    expected = np.zeros(10, np.int64)
    expected[[1, 4, 7]] = 5
    assert status.label_counts is not None and status.label_counts.dtype == np.int64
    np.testing.assert_array_equal(status.label_counts, expected)  # the task's 10 classes, not the 3 it holds
    assert status.label_counts.sum() == status.num_samples == len(data.train)  # training samples only
    assert agent.status("offline").label_counts is status.label_counts  # computed once
    decoded = decode_message(encode_message(status), expect=AgentStatus)
    assert isinstance(decoded, AgentStatus) and decoded.label_counts is not None
    np.testing.assert_array_equal(decoded.label_counts, expected)


def test_a_built_agent_without_dp_sends_its_histogram(tmp_path: Path) -> None:
    agent = build_agent(AgentSettings(device="phone", agent_id="plain", state_dir=tmp_path, partition="dirichlet",
                                      num_partitions=10, partition_index=3), set_threads=False)
    counts = agent.status().label_counts
    assert counts is not None and len(counts) == 10
    np.testing.assert_array_equal(counts, np.bincount(agent.worker.data.train.y, minlength=10))


def test_an_agent_under_dp_leaves_its_histogram_out(tmp_path: Path) -> None:
    settings = AgentSettings(device="phone", agent_id="dp-agent", state_dir=tmp_path, partition="iid",
                             num_partitions=10, dp=True, dp_target_epsilon=4.0, dp_planned_rounds=3)
    agent = build_agent(settings, set_threads=False)
    assert agent.worker.privacy is not None
    status = agent.status()
    assert status.label_counts is None  # not covered by DP-SGD: not sent
    assert status.privacy is not None and status.num_samples > 0


def test_a_regression_agent_has_no_histogram(tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32)
    task = Task(name="line", version="1", kind="regression", families={"lin": lambda: nn.Linear(3, 1)},
                load_data=lambda source, context: Dataset(x, x[:, :1].copy(), 0, "line"),
                loss=nn.functional.mse_loss)
    worker = LocalWorker("a0", task, "lin", build_local_data(task, "table"), torch.device("cpu"), 16,
                         AgentStateDir(tmp_path / "w"))
    assert agent_of(worker, tmp_path).status().label_counts is None
