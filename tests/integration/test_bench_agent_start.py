"""bench/agent_start.py --quick runs end to end (a real Mosquitto, a coordinator and three agents as processes, in
each mode) and prints one row per mode; times and CPU are reported, not asserted."""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUMBER = r"\d+\.\d+"


def test_agent_start_bench_quick_prints_one_row_per_mode() -> None:
    out = run_bench("agent_start.py", "--quick", timeout_s=900)
    rows = re.findall(rf"^\| 3 \| (fresh|forked, cold|forked, warm) \| ({NUMBER}) \| ({NUMBER}) \| ({NUMBER}) \| "
                      rf"({NUMBER}|-) \|$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["fresh", "forked, cold", "forked, warm"], out
    fresh, cold, warm = rows
    assert fresh[2] == "1.00" and fresh[4] == "-", out  # the baseline's own ratio; no parent
    for _, seconds, ratio, _, parent in (cold, warm):
        assert abs(float(ratio) - float(seconds) / float(fresh[1])) <= 0.015, out
        assert float(parent) > 0.0, out  # the parent's imports: its CPU is reported, and it ran
    assert all(float(r[3]) > 0.0 for r in rows), out  # every mode's agents did their own work
