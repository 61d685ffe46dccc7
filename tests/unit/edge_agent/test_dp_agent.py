"""A DP agent built from its settings: start-up checks, restarts over its state dir, its status and updates."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch import nn

import edge_agent.privacy.trainer as trainer_module
from edge_agent.agent import EdgeAgent
from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings
from edge_agent.models import EMBED_DIM, FedModel
from edge_agent.privacy.compat import DPIncompatibleModel, check_dp_compatible
from edge_agent.privacy.errors import BudgetExhausted
from edge_agent.tasks.registry import resolve_task
from protocol.messages import GlobalState, LocalTraining, RoundAnnouncement, StateRef
from protocol.tasks import BUILTIN_CARDS
from tests.task_refs import DIGITS, family_layouts
from tests.unit.edge_agent.rounds import global_state, global_weights

REPO = Path(__file__).resolve().parents[3]


def settings(state_dir: Path, **dp: object) -> AgentSettings:
    fields: dict[str, object] = {"dp": True, "dp_target_epsilon": 4.0, "dp_planned_rounds": 3, **dp}
    return AgentSettings(device="phone", agent_id="dp-agent", state_dir=state_dir, partition="iid",
                         num_partitions=10, **fields)


def announce(round_number: int, run_id: str = "run-a", task: str = "train") -> RoundAnnouncement:
    state = start(run_id)
    return RoundAnnouncement(run_id=run_id, round=round_number, task=task, task_ref=DIGITS,  # type: ignore[arg-type]
                             layouts=family_layouts(["mlp_tiny"]), algorithm="fedavg",
                             training=LocalTraining(epochs=1, learning_rate=0.5), selected=["dp-agent"],
                             states={"mlp_tiny": StateRef(family="mlp_tiny", round=state.round, digest=state.digest)},
                             init_seed=0, issued_at=time.time(), deadline_s=60.0, last_round=10)


def start(run_id: str = "run-a") -> GlobalState:
    """The global state every round here trains from (a bootstrap round trains nothing: it proposes the initial model)."""
    return global_state("mlp_tiny", 1, weights=global_weights("mlp_tiny"), run_id=run_id)


def epsilon_of(agent: EdgeAgent) -> float:
    spent = agent.status().privacy
    assert spent is not None
    return spent.epsilon


# -- start-up ------------------------------------------------------------------------------
def bn_cnn(in_shape: tuple[int, int, int]) -> nn.Module:
    return nn.Sequential(nn.Conv2d(in_shape[0], 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, EMBED_DIM))


def test_batchnorm_is_refused_with_why_and_what_to_use_instead() -> None:
    with pytest.raises(DPIncompatibleModel) as refused:
        check_dp_compatible(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), "bn_mlp")
    message = str(refused.value)
    assert "bn_mlp" in message and "1 (BatchNorm1d)" in message  # which model, which layer
    assert "statistics of the whole batch" in message  # why
    assert "nn.GroupNorm(num_groups, 4)" in message  # what instead


def test_agent_with_dp_refuses_a_batchnorm_family_at_start(tmp_path: Path) -> None:
    digits = resolve_task("digits")
    with_bn = dataclasses.replace(digits, families={
        **digits.families, "bn_cnn": lambda: FedModel.with_linear_head(bn_cnn((1, 8, 8)), EMBED_DIM, 10)})
    with pytest.raises(DPIncompatibleModel, match=r"features\.1 \(BatchNorm2d\).*GroupNorm"):
        build_agent(settings(tmp_path / "dp", family="bn_cnn"), set_threads=False, task=with_bn)
    plain = build_agent(AgentSettings(device="phone", family="bn_cnn", state_dir=tmp_path / "plain"), set_threads=False,
                        task=with_bn)
    assert plain.worker.privacy is None  # without DP the same model is fine


@pytest.mark.parametrize(("task", "family"), [(t, f) for t, card in BUILTIN_CARDS.items() for f in card.families])
def test_every_builtin_family_is_dp_compatible(task: str, family: str) -> None:
    check_dp_compatible(resolve_task(task).build_model(family, seed=0), family)


def test_cli_names_the_dp_field_that_is_wrong(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge_agent", "run", "--dp-noise-multiplier", "1.0", "--state-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert "dp_noise_multiplier set but dp is off" in result.stderr


@pytest.mark.parametrize(("fields", "message"), [
    ({"dp": True}, "exactly one of dp_noise_multiplier"),
    ({"dp": True, "dp_noise_multiplier": 1.0, "dp_target_epsilon": 3.0}, "exactly one of dp_noise_multiplier"),
    ({"dp": True, "dp_target_epsilon": 3.0}, "dp_target_epsilon needs dp_planned_rounds"),
    ({"dp": True, "dp_noise_multiplier": 1.0, "dp_planned_rounds": 5}, "dp_planned_rounds is only used"),
    ({"dp": True, "dp_target_epsilon": 3.0, "dp_planned_rounds": 5, "dp_budget_epsilon": 2.0}, "below dp_target"),
    ({"dp": True, "dp_noise_multiplier": 1.0, "dp_accountant": "gdp"}, "can report less epsilon than was spent"),
    ({"dp": True, "dp_target_epsilon": 4.0, "dp_planned_rounds": 4, "dp_prototype_noise_multiplier": 2.0},
     "for the training steps alone"),  # the releases would spend the budget before the planned rounds
    ({"dp": True, "dp_noise_multiplier": 1.0, "tf32": True}, "tf32 cannot be on with dp"),
    ({"dp": True, "dp_noise_multiplier": -1.0}, "dp_noise_multiplier"),
    ({"dp": True, "dp_noise_multiplier": 1.0, "dp_delta": 1.0}, "dp_delta"),
])
def test_bad_dp_settings_fail_at_start(tmp_path: Path, fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgentSettings(state_dir=tmp_path, **fields)


# -- restarts --------------------------------------------------------------------------------
def test_restarted_agent_continues_from_its_saved_epsilon(tmp_path: Path) -> None:
    first = build_agent(settings(tmp_path), set_threads=False)
    assert epsilon_of(first) == 0.0
    update = first.worker.answer(announce(1), start())
    assert update.privacy is not None and update.privacy.epsilon > 0
    assert update.metrics.train_loss is None and update.metrics.train_accuracy is None  # not covered by DP
    after_one = update.privacy.epsilon
    del first

    second = build_agent(settings(tmp_path), set_threads=False)  # the device rebooted
    assert epsilon_of(second) == after_one
    update = second.worker.answer(announce(2), start())
    assert update.privacy is not None and update.privacy.epsilon > after_one
    after_two = update.privacy.epsilon

    third = build_agent(settings(tmp_path), set_threads=False)  # a new run: the budget is the agent's
    assert epsilon_of(third) == after_two
    update = third.worker.answer(announce(1, run_id="run-b"), start("run-b"))
    assert update.privacy is not None and update.privacy.epsilon > after_two
    assert update.privacy.exhausted  # the three planned rounds are spent
    assert third.status().state == "budget_exhausted"
    with pytest.raises(BudgetExhausted):
        third.worker.answer(announce(2, run_id="run-b"), start("run-b"))

    fourth = build_agent(settings(tmp_path), set_threads=False)
    assert epsilon_of(fourth) == update.privacy.epsilon
    assert fourth.status().state == "budget_exhausted"
    assert fourth.status("offline").state == "budget_exhausted"  # also its last will


def test_a_round_cut_short_by_a_crash_still_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def power_cut(*args: object, **kwargs: object) -> None:
        raise RuntimeError("power cut")

    agent = build_agent(settings(tmp_path), set_threads=False)
    monkeypatch.setattr(trainer_module, "train_private", power_cut)
    with pytest.raises(RuntimeError, match="power cut"):
        agent.worker.answer(announce(1), start())
    monkeypatch.undo()
    rebooted = build_agent(settings(tmp_path), set_threads=False)
    assert epsilon_of(rebooted) > 0  # charged before the data was touched
    assert rebooted.worker.privacy is not None and rebooted.worker.privacy.ledger.rounds == 1


def test_evaluation_answers_carry_the_epsilon_and_spend_nothing(tmp_path: Path) -> None:
    agent = build_agent(settings(tmp_path), set_threads=False)
    agent.worker.answer(announce(1), start())
    spent = epsilon_of(agent)
    update = agent.worker.answer(announce(2, task="evaluate"), start())
    assert update.privacy is not None and update.privacy.epsilon == spent == epsilon_of(agent)


def test_agent_without_dp_reports_no_privacy(tmp_path: Path) -> None:
    agent = build_agent(AgentSettings(device="phone", agent_id="dp-agent", state_dir=tmp_path, partition="iid",
                                      num_partitions=10), set_threads=False)
    assert agent.status().privacy is None
    assert agent.worker.answer(announce(1), start()).privacy is None
    assert not (tmp_path / "privacy.json").exists()
