"""bench/accuracy.py --quick runs end to end (real broker, coordinator and agents) and prints its table.

Its numbers after three rounds mean nothing; only that every row ran and every goal printed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = ["centralised (cnn_small, pooled data)", "FedAvg 3/6 ", "FedProx mu=", "SCAFFOLD 3/6", "FedProto lambda=",
        "each agent alone (lambda=0)"]


def test_accuracy_bench_quick_prints_one_table_with_goals(tmp_path: Path) -> None:
    out = run_bench("accuracy.py", "--quick", "--out", str(tmp_path), timeout_s=900)
    assert re.search(r"^row\s+partition\s+rounds\s+test acc\s+by proto\s+held-out\s+upload B/agent/round", out,
                     re.MULTILINE), out
    table = out[out.index("\nrow "):]
    for row in ROWS:
        assert row in table, (row, table)
    for partition in ("IID", "Dir(0.5)", "Dir(0.1)", "3 classes/agent"):
        assert partition in table
    assert len(re.findall(r"^(?:FedAvg|FedProx|SCAFFOLD) .*\d+\.\d+%", table, re.MULTILINE)) == 7
    verdicts = re.findall(r"^(PASS|MISS)  (.+)$", out, re.MULTILINE)
    assert [text.split(" ")[0] for _, text in verdicts] == ["centralised", "FedAvg", "FedProx", "FedProto", "FedProto"]
    assert (tmp_path / "accuracy.png").stat().st_size > 10_000
    report = json.loads((tmp_path / "accuracy.json").read_text())
    assert len(report["rows"]) == 10 and report["rows"][0]["key"] == "central"
    federated = [r for r in report["rows"] if r["key"] != "central"]
    assert all(len(r["curve"]) == 3 and r["failed_rounds"] == 0 for r in federated)
    assert all(len(r["label_skew"]) == 6 and "kl_divergence" in r["label_skew"][0] for r in federated)
    proto = next(r for r in report["rows"] if r["key"] == "fedproto")
    assert 2560 < proto["upload_bytes_per_agent_round"] < 2560 + 2048


def test_accuracy_bench_quick_for_another_task_prints_its_families() -> None:
    out = run_bench("accuracy.py", "--quick", "--task", "mnist-5k", timeout_s=900)
    table = out[out.index("\nrow "):]
    assert re.search(r"^row\s+family\s+partition\s+rounds\s+test acc\s+held-out\s+s/round", table.strip(), re.MULTILINE)
    rows = re.findall(r"^(centralised|FedAvg|SCAFFOLD).*?(cnn_large|cnn_small|mlp_tiny)\s+(\S+)\s+\S+\s+(\d+\.\d+)%",
                      table, re.MULTILINE)
    assert [(kind, family, partition) for kind, family, partition, _ in rows] == [
        ("centralised", "cnn_large", "all"), ("FedAvg", "cnn_large", "IID"), ("FedAvg", "cnn_small", "IID"),
        ("FedAvg", "mlp_tiny", "IID"), ("FedAvg", "cnn_large", "Dir(0.5)"), ("SCAFFOLD", "cnn_large", "Dir(0.5)")]
    assert all(0.0 <= float(acc) <= 100.0 for *_, acc in rows)
    verdicts = re.findall(r"^(PASS|MISS)  (.+)$", out, re.MULTILINE)
    assert [text.split(" ")[0] for _, text in verdicts] == ["centralised", "FedAvg"]
