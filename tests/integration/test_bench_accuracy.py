"""bench/accuracy.py --quick runs end to end (real broker, coordinator and agents) for digits and for
mnist-5k, prints one table with every algorithm and its goals, and writes its JSON and plot.

After a few rounds the numbers mean little; what is checked: every row ran on the data it says
(partition sizes, the few-shot cap), the printed goals agree with the accuracies they compare, the
models learned something, and ``--tune`` tunes on the task it is given, choosing by held-out only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KEYS = ["central", "fedavg-iid", "fedavg-iid-cnn_large", "fedavg-iid-mlp_tiny", "fedavg-0.5", "fedprox-0.5",
        "scaffold-0.5", "fedavg-0.1", "fedprox-0.1", "scaffold-0.1", "fedavg-0.1-clipped",
        "scaffold-0.1-plain", "fedavg-0.1-bounded",
        "fedproto", "alone", "fedproto-few-s0", "alone-few-s0"]
VERDICTS = ["centralised at least", "FedAvg IID within", "FedProx at or above FedAvg at Dir(0.1)",
            "SCAFFOLD at or above FedAvg at Dir(0.1)", "FedProto at or above alone, 3 classes/agent",
            "FedProto upload within", "FedProto at least 3 points above alone, few-shot",
            "FedProto at or above alone in every few-shot seed"]
POOL = {"digits": 1438, "mnist-5k": 4000}
"""Training pool of each task's built-in set (its test split is apart)."""
FEW_SHOT_CAP = 5  # the quick plan's samples of each class per agent


def run_quick(task: str, out: Path) -> tuple[str, dict[str, Any]]:
    text = run_bench("accuracy.py", "--quick", "--task", task, "--out", str(out), timeout_s=1200)
    return text, json.loads((out / "accuracy.json").read_text())


def check_table(text: str, report: dict[str, Any], task: str, rounds: int, out: Path) -> None:
    assert re.search(r"^row\s+family\s+partition\s+rounds\s+test acc\s+by proto\s+held-out\s+upload", text,
                     re.MULTILINE), text
    rows = {r["key"]: r for r in report["rows"]}
    # SCAFFOLD runs stabilised (digits: a decaying local rate; mnist-5k: the norm clip, the restricted softmax): its
    # contrast row runs without them
    keys = [k for k in KEYS if task == "digits" or k != "fedprox-0.5"]
    assert report["task"] == task and list(rows) == keys
    table = text[text.index("\nrow "):]
    for row in report["rows"]:  # each row printed with the accuracy the JSON holds
        assert re.search(rf"^{re.escape(row['name'])}\s+.*{row['accuracy']:.2%}", table, re.MULTILINE), row["name"]
    federated = [r for r in report["rows"] if r["key"] != "central"]
    assert rows["fedavg-iid"]["train"]["rounds"] == rounds  # the quick plan's (FedProto rows: their own)
    assert all(len(r["curve"]) == r["train"]["rounds"] and r["failed_rounds"] == 0 for r in federated)
    # the table measures learning (influence bounds off); one row keeps the coordinator's default bounds
    bounds = {"claim_cap_multiple", "max_norm_ratio"}
    assert all(r["train"]["params"].keys() >= bounds for r in federated if r["key"] != "fedavg-0.1-bounded")
    assert not rows["fedavg-0.1-bounded"]["train"]["params"].keys() & bounds
    clipped = ["fedavg-0.1-clipped", *(["scaffold-0.1"] if task == "mnist-5k" else [])]
    for key in clipped:  # the default norm clip, claims uncapped
        assert {k: rows[key]["train"]["params"][k] for k in bounds} == {"claim_cap_multiple": 0.0, "max_norm_ratio": 1.0}
    stabilised = rows["scaffold-0.1"]["train"]["params"]
    if task == "mnist-5k":
        assert stabilised["scaffold_absent_class_scale"] == 0.5
    else:
        assert stabilised["learning_rate_decay"] == 0.95 and stabilised["max_norm_ratio"] == 0.0
    plain = rows["scaffold-0.1-plain"]["train"]["params"]
    assert plain["max_norm_ratio"] == 0.0 and not plain.keys() & {"scaffold_absent_class_scale", "learning_rate_decay"}
    # every row but the few-shot ones partitions the whole pool of this task's data
    for row in federated:
        samples = [s["samples"] for s in row["label_skew"]]
        if "-few-" in row["key"]:
            assert all(s == 3 * FEW_SHOT_CAP for s in samples), (row["key"], samples)  # 3 classes, capped
        else:
            assert sum(samples) == POOL[task], (row["key"], sum(samples))
    assert all(s["classes"] == 3 for r in federated if r["partition"].startswith("3 ") for s in r["label_skew"])
    # the models learned (chance is 10%); a broken round or aggregation stays near chance
    assert rows["central"]["accuracy"] > 0.3 and rows["fedavg-iid"]["accuracy"] > 0.2
    assert rows["fedproto"]["accuracy"] > 0.5  # 3 classes per agent: chance is 33%
    assert 2560 < rows["fedproto"]["upload_bytes_per_agent_round"] < 2560 + 2048
    check_verdicts(text, report, rows)
    assert (out / "accuracy.png").stat().st_size > 10_000


def check_verdicts(text: str, report: dict[str, Any], rows: dict[str, Any]) -> None:
    """The printed goals are the JSON's, in order, and each PASS/MISS agrees with the accuracies it compares."""
    printed = re.findall(r"^(PASS|MISS)  (.+)$", text, re.MULTILINE)
    assert [(ok == "PASS", goal) for ok, goal in printed] == [(g["pass"], g["goal"]) for g in report["goals"]]
    assert [next(v for v in VERDICTS if goal.startswith(v)) for _, goal in printed] == VERDICTS
    acc = {key: row["accuracy"] for key, row in rows.items()}
    expected = [acc["central"] >= 0.98 if report["task"] == "digits" else acc["central"] >= 0.97,
                acc["central"] - acc["fedavg-iid"] <= 0.015, acc["fedprox-0.1"] >= acc["fedavg-0.1"],
                acc["scaffold-0.1"] >= acc["fedavg-0.1"], acc["fedproto"] >= acc["alone"], True,
                acc["fedproto-few-s0"] - acc["alone-few-s0"] >= 0.03, acc["fedproto-few-s0"] >= acc["alone-few-s0"]]
    assert [g["pass"] for g in report["goals"]] == expected


@pytest.mark.parametrize("task", ["digits", "mnist-5k"])
def test_accuracy_bench_quick_prints_one_table_per_task_with_goals(task: str, tmp_path: Path) -> None:
    text, report = run_quick(task, tmp_path)
    check_table(text, report, task, 3 if task == "digits" else 2, tmp_path)
    assert re.search(r"^  gain \(points\)\s+mean\s+-?\d+\.\d+", text, re.MULTILINE), text  # the few-shot summary


def test_accuracy_tune_tunes_on_the_task_given_by_held_out_accuracy(tmp_path: Path) -> None:
    text = run_bench("accuracy.py", "--quick", "--tune", "--task", "mnist-5k", "--only", "fedprox", "--out",
                     str(tmp_path), timeout_s=900)
    assert "tuning on task mnist-5k" in text
    report = json.loads((tmp_path / "tune.json").read_text())
    runs = report["runs"]
    assert report["task"] == "mnist-5k" and [r["algorithm"] for r in runs] == ["fedprox"] * 4
    assert all(r["samples"] == POOL["mnist-5k"] for r in runs)  # mnist's pool, not digits'
    best = max(runs, key=lambda r: r["held_out"])  # the first of equals, as the bench chooses
    assert report["chosen"] == {"fedprox": best["settings"]}
    assert [r["settings"]["params"]["prox_mu"] for r in runs] == [0.001, 0.01, 0.1, 1.0]
