"""The demo end to end: the embedded amqtt broker, a coordinator and three agents as processes, the report."""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path

import pytest
from rich.console import Console

from launcher.demo import DemoConfig, run_demo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 2


def test_demo_runs_on_the_embedded_broker_and_writes_its_report(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    output = io.StringIO()
    config = DemoConfig(agents=3, rounds=ROUNDS, devices=["phone", "rpi"], out=tmp_path / "run", embedded="amqtt",
                        local_epochs=1, timeout_s=300)
    result = run_demo(config, Console(file=output, width=160))
    printed = output.getvalue()
    assert result.ok, f"{result.reason}\n{printed[-4000:]}"
    assert "run finished" in printed and "amqtt" in printed
    # The broker runs in this process: nothing of it failed (amqtt once failed a client connecting beside another).
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-4000:]

    run_dir = tmp_path / "run"
    for name in ("report.json", "rounds.csv", "accuracy.png"):
        assert (run_dir / name).is_file() and (run_dir / name).stat().st_size > 0, name
        assert result.files[name] == run_dir / name
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["ok"] is True and report["run"]["broker"] == "amqtt (embedded)"
    assert [(r["round"], r["task"], r["outcome"]) for r in report["rounds"]] == [
        (1, "train", "completed"), (2, "train", "completed"), (ROUNDS + 1, "evaluate", "completed")]
    assert all(r["answered"] == 3 for r in report["rounds"]), report["rounds"]
    assert [a["device"] for a in report["fleet"]] == ["phone", "rpi", "phone"]

    # The final models, scored centrally on the held-back test split.
    evaluation = report["central_evaluation"]
    assert evaluation is not None and evaluation["missing"] == []
    assert set(evaluation["families"]) == {"mlp_tiny", "cnn_small"}
    assert {f: e["agents"] for f, e in evaluation["families"].items()} == {"mlp_tiny": 2, "cnn_small": 1}
    assert all(e["trained_rounds"] == ROUNDS for e in evaluation["families"].values())
    assert 0.0 < evaluation["overall_accuracy"] <= 1.0 and evaluation["test_samples"] > 0

    with (run_dir / "rounds.csv").open() as handle:
        assert [row["round"] for row in csv.DictReader(handle)] == ["1", "2", "3"]
    assert (run_dir / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
