"""bench/async.py --quick runs end to end (real broker, coordinator and agents) and prints both tables.

Its numbers after two rounds mean nothing; only that every policy and weighting ran and printed.
"""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_async_bench_quick_prints_the_policies_and_the_weighting() -> None:
    out = run_bench("async.py", "--quick", timeout_s=900)
    rows = re.findall(r"^(sync FedAvg|sync, over-selection|FedBuff) .*?\s+(\d+)\s+(never|\d+s)\s+(\d+\.\d+)%", out,
                      re.MULTILINE)
    assert [name for name, *_ in rows] == ["sync FedAvg", "sync, over-selection", "FedBuff"], out
    versions = {name: int(count) for name, count, *_ in rows}
    assert versions["sync FedAvg"] == 2 and versions["FedBuff"] >= 2  # FedBuff runs three times the versions
    verdicts = re.findall(r"^(PASS|MISS)  (.+)$", out, re.MULTILINE)
    assert [text.split(" ")[0] for _, text in verdicts] == ["FedBuff", "final", "kl", "kl", "kl"]
    assert "kl worst-class accuracy >= sample weighting's" in out and "kl erases no class" in out
    weighting = re.findall(r"^(samples|kl \(T=1\))\s+(\d+\.\d+)%\s+(\d\.\d+)\s+(\d+\.\d+)% \(#\d\)", out,
                           re.MULTILINE)
    assert [name for name, *_ in weighting] == ["samples", "kl (T=1)"], out  # with each row's worst class


def test_async_bench_weighting_runs_without_the_default_bounds_at_another_temperature() -> None:
    out = run_bench("async.py", "--quick", "--only", "weighting", "--unbounded", "--temperature", "2", timeout_s=900)
    assert "T = 2, seed 0, bounds off (claims uncapped, nothing clipped):" in out, out
    assert re.findall(r"^(samples|kl \(T=2\))\s+\d+\.\d+%", out, re.MULTILINE) == ["samples", "kl (T=2)"], out
    assert "round policies" not in out  # part 2 alone
