"""Deleting privacy.json starts a new budget (documented: honest only for a device with new data). Where the agent's
own state dir shows it answered rounds before (progress.json), it now says so in a warning; the coordinator's
rollback check is the guard beyond it (found in review)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings
from tests.unit.edge_agent.test_dp_agent import announce, start


def settings(state_dir: Path) -> AgentSettings:
    return AgentSettings(device="phone", agent_id="dp-agent", state_dir=state_dir, partition="iid", num_partitions=10,
                         dp=True, dp_noise_multiplier=1.0, dp_budget_epsilon=5.0)


def test_a_missing_ledger_next_to_evidence_of_dp_rounds_is_not_a_silent_fresh_budget(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent = build_agent(settings(tmp_path), set_threads=False)
    ann = announce(1)
    update = agent.worker.answer(ann, start())
    agent._mark_answered(ann)  # what the loop does with the outcome (agent.py:431): progress.json = (run-a, 1)
    assert update.privacy is not None and update.privacy.epsilon > 0
    assert (tmp_path / "progress.json").exists()
    (tmp_path / "privacy.json").unlink()  # lost (or removed by an operator clearing "a corrupt file")

    caplog.set_level(logging.WARNING)
    try:
        again = build_agent(settings(tmp_path), set_threads=False)
    except ValueError as exc:
        assert "privacy.json" in str(exc)
        return
    spent = again.status().privacy
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "privacy" in r.getMessage()]
    assert warned, (f"fresh budget (epsilon {spent.epsilon if spent else None}) for an agent whose progress.json says "
                    f"it answered run-a round 1 under DP, spending {update.privacy.epsilon:.4g}; nothing was logged")
