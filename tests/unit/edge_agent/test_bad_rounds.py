"""Rounds an agent cannot answer: dropped whole (nothing sent, no state kept), never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import edge_agent.worker as worker_module
from edge_agent.algorithms.fedproto import personal_model_name
from edge_agent.state import AgentStateDir
from protocol.errors import ProtocolError, Reason

from .rounds import RUN, announce, digits_subset, global_state, global_weights, make_worker


@pytest.fixture
def diverging_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real local training, after which the weights have blown up to NaN."""
    real = worker_module.train_local

    def train_then_blow_up(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = real(model, *args, **kwargs)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float("nan"))
        return result

    monkeypatch.setattr(worker_module, "train_local", train_then_blow_up)


def test_a_diverged_scaffold_round_leaves_no_control_variate(tmp_path: Path, diverging_training: None) -> None:
    data = digits_subset()
    worker = make_worker(tmp_path, data)
    state = global_state("cnn_small", 2, weights=global_weights("cnn_small"),
                         control={k: v * 0 for k, v in global_weights("cnn_small").items()
                                  if not k.endswith("num_batches_tracked")})
    with pytest.raises(ProtocolError) as info:
        worker.answer(announce("scaffold", 2, state, momentum=0.0, epochs=1), state)
    assert info.value.reason is Reason.NON_FINITE
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("scaffold-")]


def test_a_diverged_fedproto_round_keeps_the_previous_personal_model(tmp_path: Path,
                                                                     diverging_training: None) -> None:
    data = digits_subset()
    worker = make_worker(tmp_path, data)
    with pytest.raises(ProtocolError) as info:
        worker.answer(announce("fedproto", 1, params={"lambda": 1.0}, epochs=1), None)
    assert info.value.reason is Reason.NON_FINITE
    assert AgentStateDir(tmp_path).read_arrays(personal_model_name(RUN, "cnn_small")) is None


def test_an_unknown_family_fails_at_start_not_at_the_first_round(tmp_path: Path) -> None:
    from edge_agent.bootstrap import build_agent
    from edge_agent.config import AgentSettings

    with pytest.raises(ValueError, match="family 'nope' is not a model family"):
        build_agent(AgentSettings(family="nope", state_dir=tmp_path), set_threads=False)
