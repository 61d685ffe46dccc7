"""An agent's side of a task: its data (declared label space, held-out split) and which rounds it refuses."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edge_agent.data.datasets import Dataset
from edge_agent.data.local import build_local_data
from edge_agent.state import AgentStateDir
from edge_agent.tasks import Task, resolve_task
from edge_agent.tasks.checks import model_fingerprint
from edge_agent.weights import get_arrays
from edge_agent.worker import LocalWorker
from protocol.messages import GlobalState, LocalTraining, RoundAnnouncement, TaskRef

DIGITS = resolve_task("digits")


def announce(task_ref: TaskRef, layouts: dict[str, str], selected: list[str], round_number: int = 1) -> RoundAnnouncement:
    return RoundAnnouncement(run_id="r", round=round_number, task="train", task_ref=task_ref, layouts=layouts,
                             algorithm="fedavg", training=LocalTraining(epochs=1, learning_rate=0.05),
                             selected=selected, init_seed=0, issued_at=time.time(), deadline_s=60.0, last_round=3)


def worker(tmp_path: Path, task: Task, family: str, data: str | None = None, **kwargs: object) -> LocalWorker:
    local = build_local_data(task, data, **kwargs)  # type: ignore[arg-type]
    return LocalWorker("a", task, family, local, torch.device("cpu"), 32, AgentStateDir(tmp_path / "state"))


def test_a_skewed_npz_keeps_the_declared_label_space(tmp_path: Path) -> None:
    """The bug this replaces: a device holding only labels 0-3 built a 4-class head, so all its updates had
    another layout than its family's (bad_shape). Its head now has the task's 10 classes."""
    rng = np.random.default_rng(0)
    path = tmp_path / "skewed.npz"
    np.savez(path, x=rng.integers(0, 256, (60, 8, 8), dtype=np.uint8), y=np.arange(60) % 4)
    skewed = worker(tmp_path, DIGITS, "cnn_small", str(path))
    assert skewed.data.train.num_classes == 10 and set(skewed.data.train.y.tolist()) <= {0, 1, 2, 3}
    assert skewed.layout == model_fingerprint(DIGITS.build_model("cnn_small", 0))


def test_the_held_out_split_comes_from_eval_data_when_given(tmp_path: Path) -> None:
    split = worker(tmp_path, DIGITS, "mlp_tiny", "digits", eval_fraction=0.25)
    assert len(split.data.held_out) == round(0.25 * (len(split.data.train) + len(split.data.held_out)))
    separate = worker(tmp_path, DIGITS, "mlp_tiny", "digits", eval_data="digits:test")
    assert len(separate.data.train) == 1438 and len(separate.data.held_out) == 359  # the whole pool trains
    update = separate.answer(announce(DIGITS.card.ref, {"mlp_tiny": separate.layout}, ["a"]), None)
    assert update.metrics.num_eval_samples == 359  # the metrics it reports come from that split


def test_rounds_of_another_task_version_or_layout_are_refused(tmp_path: Path) -> None:
    agent = worker(tmp_path, DIGITS, "cnn_small")
    ours = {"cnn_small": agent.layout}
    assert agent.refusal(announce(DIGITS.card.ref, ours, ["a"])) is None
    assert agent.refusal(announce(DIGITS.card.ref, {}, ["b"])) is None  # not selected: nothing to compare
    other_task = agent.refusal(announce(TaskRef(name="acme", version="1"), ours, ["a"]))
    assert other_task == "round 1 trains task acme@1, this agent runs digits@1"
    other_version = agent.refusal(announce(TaskRef(name="digits", version="2"), ours, ["a"]))
    assert other_version is not None and "digits@2" in other_version
    other_layout = agent.refusal(announce(DIGITS.card.ref, {"cnn_small": "0" * 32}, ["a"]))
    assert other_layout is not None and "the task's code differs between devices" in other_layout
    missing = agent.refusal(announce(DIGITS.card.ref, {"cnn_large": "0" * 32}, ["a"]))
    assert missing == "round 1 announces no layout for family cnn_small"


def test_a_regression_task_reports_its_own_metrics(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((80, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32))[:, None]

    def mae(out: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        return {"mae": (out - target).abs().mean().item()}

    task = Task(name="line", version="1", kind="regression", families={"lin": lambda: nn.Linear(3, 1)},
                load_data=lambda source, context: Dataset(x, y, 0, "line"), loss=nn.functional.mse_loss, metrics=mae)
    agent = worker(tmp_path, task, "lin", "table")
    start = get_arrays(task.build_model("lin", seed=0))  # a training round (a bootstrap one trains nothing)
    state = GlobalState(run_id="r", family="lin", round=1, weights=start, control={},
                        digest=GlobalState.compute_digest(start, {}, None, None))
    update = agent.answer(announce(task.card.ref, {"lin": agent.layout}, ["a"]), state)
    assert update.metrics.eval_accuracy is None and update.metrics.train_accuracy is None
    assert update.metrics.extra["local_eval_mae"] < update.metrics.extra["eval_mae"]  # training helped
    with pytest.raises(ValueError, match="partition 'dirichlet' skews labels"):
        build_local_data(task, "table", partition="dirichlet", num_partitions=2)
