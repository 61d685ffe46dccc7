"""The run's summary shows the DP spending when there is any, and nothing extra when there is none."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rich.console import Console

from coordinator.state.rounds import RoundSummary
from launcher import report


def summary(round_number: int, epsilon: float | None, exhausted: int = 0) -> RoundSummary:
    return RoundSummary(round=round_number, task="train", outcome="completed", reason=None, selected=2, answered=2,
                        stragglers=0, dropouts=0, rejected=0, quorum=1, duration_s=1.0, deadline_s=10.0, bytes_in=10,
                        bytes_out=10, accuracy=0.5, loss=1.0, train_loss=None, closed_at=0.0, epsilon_max=epsilon,
                        budget_exhausted=exhausted)


def rendered(rounds: list[RoundSummary]) -> str:
    console = Console(width=250, record=True)
    console.print(report.summary_table(rounds, total_rounds=2))
    return console.export_text()


def test_summary_table_and_files_carry_the_epsilon(tmp_path: Path) -> None:
    rounds = [summary(1, 4.25), summary(2, 7.996, exhausted=2)]
    text = rendered(rounds)
    assert "epsilon max" in text and "exhausted" in text
    assert "7.996" in text and "4.25" in text
    data = json.loads(report.write_json(tmp_path / "report.json", run={}, rounds=rounds, fleet=[],
                                        evaluation=None).read_text())
    assert data["privacy"] == {"epsilon_max": 7.996, "budget_exhausted_agents": 2, "first_round_with_dp": 1}
    assert data["rounds"][1]["epsilon_max"] == 7.996
    with report.write_csv(rounds, tmp_path / "rounds.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["epsilon_max"] for r in rows] == ["4.25", "7.996"]


def test_runs_without_dp_show_no_privacy_columns(tmp_path: Path) -> None:
    rounds = [summary(1, None), summary(2, None)]
    assert "epsilon" not in rendered(rounds)
    data = json.loads(report.write_json(tmp_path / "report.json", run={}, rounds=rounds, fleet=[],
                                        evaluation=None).read_text())
    assert data["privacy"] is None


def test_old_round_summaries_without_privacy_fields_still_load() -> None:
    old = summary(1, None).to_dict()
    del old["epsilon_max"], old["budget_exhausted"]
    assert RoundSummary.from_dict(old).epsilon_max is None
