"""A user's model is checked at start: under DP a BatchNorm layer stops the agent, naming the layer and the fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings

BN_TASK = textwrap.dedent('''
    import numpy as np
    from torch import nn
    from edge_agent.tasks import Dataset, FedModel, Task

    def bn_cnn():
        features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(4 * 64, 8))
        return FedModel.with_linear_head(features, 8, 2)

    def load(source, context):
        rng = np.random.default_rng(0)
        return Dataset(rng.random((20, 1, 8, 8), dtype=np.float32), np.arange(20) % 2, 2, "bn")

    task = Task(name="bn", version="1", classes=("a", "b"), families={"bn_cnn": bn_cnn}, embedding_dim=8,
                load_data=load, default_data="builtin")
''')


def test_batchnorm_under_dp_fails_at_start_naming_the_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bn_task_mod.py").write_text(BN_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    state = tmp_path / "state"
    settings = AgentSettings(task="bn_task_mod:task", state_dir=state, dp=True, dp_noise_multiplier=1.0)
    with pytest.raises(ValueError) as error:
        build_agent(settings, set_threads=False)
    message = str(error.value)
    assert "model family 'bn_cnn' cannot train with differential privacy" in message
    assert "features.1 (BatchNorm2d)" in message and "nn.GroupNorm(num_groups, 4)" in message
    assert not (state / "agent_id").exists()  # nothing about this device is made before its settings are valid
    agent = build_agent(AgentSettings(task="bn_task_mod:task", state_dir=state), set_threads=False)  # no DP: fine
    assert agent.worker.family == "bn_cnn" and (state / "agent_id").exists()
