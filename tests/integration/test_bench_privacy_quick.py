"""bench/privacy.py --quick runs the real federation on a Mosquitto it starts, and prints its table."""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_privacy_bench_quick_prints_its_table() -> None:
    out = run_bench("privacy.py", "--quick", timeout_s=900)
    assert re.search(r"^epsilon\s+federated\s+central DP-SGD\s+gap \(points\)", out, re.MULTILINE), out
    rows = {m.group(1): m for m in re.finditer(
        r"^\s+(no DP|8)\s+([\d.]+)%\s+([\d.]+)%\s+(-?[\d.]+)\s+(\S+)\s+(\S+)", out, re.MULTILINE)}
    assert set(rows) == {"no DP", "8"}, out
    assert rows["no DP"].group(5) == "-"  # no epsilon without DP
    assert 0 < float(rows["8"].group(5)) <= 8.0  # what the agents reported spending, within the target
    assert float(rows["8"].group(2)) > 30.0  # DP training learns (chance is 10%); accuracy is not a test goal here
    assert re.search(r"^(PASS|MISS)\s+epsilon 8: federated", out, re.MULTILINE), out
    assert not re.search(r"^\s+[13]\s", out, re.MULTILINE), "--quick measures no DP and epsilon 8 only"
