"""bench/secagg.py --accuracy --quick runs end to end (a real Mosquitto, the real coordinator and agents on
threads): the same digits fleet trains once with plain FedAvg and once with secure aggregation, and one table
holds both. After 3 rounds of a small model the accuracy goal means little and timings are the machine's, so
neither is asserted; what is: both runs completed every round, the secure one aggregated every round after
the bootstrap securely and the plain one none, each row prints an accuracy, and the goal line is judged
from the printed difference."""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 3  # the quick plan's; round 1 is the bootstrap (seeded weights, plain by design)


def test_secagg_accuracy_bench_quick_runs_plain_and_secure_fedavg_into_one_table() -> None:
    out = run_bench("secagg.py", "--accuracy", "--quick", timeout_s=600)
    rows = re.findall(r"^\| (plain|secure) FedAvg \| (\d+\.\d\d)% \| (\d+)/(\d+) \| (\d+)/(\d+) \| [\d.]+ \| \d+ \|$",
                      out, re.MULTILINE)
    assert [r[0] for r in rows] == ["plain", "secure"], out
    accuracy = {mode: float(acc) for mode, acc, *_ in rows}
    for mode, _, done, trained, secure, of in rows:
        assert int(done) == int(trained) == int(of) == ROUNDS, (mode, out)
        assert int(secure) == (ROUNDS - 1 if mode == "secure" else 0), (mode, out)
    assert all(10.0 < a <= 100.0 for a in accuracy.values()), out  # both learned past chance (10 classes)
    difference = re.search(r"^difference secure - plain: ([+-]\d+\.\d\d) points", out, re.MULTILINE)
    assert difference, out
    assert abs(float(difference.group(1)) - (accuracy["secure"] - accuracy["plain"])) <= 0.02, out
    verdict = re.search(r"^(PASS|MISS)  secure FedAvg within 0.5 points of plain FedAvg after 3 rounds", out,
                        re.MULTILINE)
    assert verdict and (verdict.group(1) == "PASS") == (abs(float(difference.group(1))) <= 0.5), out
    assert re.search(r"^round time secure / plain: \d+\.\d\dx", out, re.MULTILINE), out
    assert len(re.findall(r"^clip probe, every agent training once from the ", out, re.MULTILINE)) == 2, out
    assert "FAIL" not in out
