"""bench/scaffold_reference.py --quick runs end to end: the paper's SCAFFOLD (both options, both means) and
plain FedAvg on one digits split, each row a curve of test accuracies. Four rounds mean little, so only the
table's shape and its arithmetic are asserted: one row per variant, a curve of --rounds accuracies, and the
final and best columns read from that curve."""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_scaffold_reference_quick_prints_one_curve_per_variant() -> None:
    out = run_bench("scaffold_reference.py", "--quick", timeout_s=600)
    rows = re.findall(r"^\| ([\w-]+) \| (\d+\.\d\d) \| (\d+\.\d\d) \| - \| ([\d. ]+) \|$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["fedavg", "scaffold-II", "scaffold-II-paper", "scaffold-I"], out
    for name, final, best, curve in rows:
        accuracies = [float(a) for a in curve.split()]
        assert len(accuracies) == 4 and all(0.0 <= a <= 100.0 for a in accuracies), (name, out)
        assert abs(float(final) - accuracies[-1]) <= 0.05 and abs(float(best) - max(accuracies)) <= 0.05, (name, out)
