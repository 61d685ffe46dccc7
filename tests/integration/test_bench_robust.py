"""bench/robust.py --quick runs end to end (a real Mosquitto, the real round engine) and prints
its tables; neither timings nor accuracies are asserted (DESIGN.md)."""

from __future__ import annotations

import re

import pytest

from coordinator.aggregation.registry import RULES
from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_robust_bench_quick_prints_its_three_tables() -> None:
    out = run_bench("robust.py", "--quick", timeout_s=600)
    # (b) speed: every rule and reference timed, memory measured, every goal judged
    assert re.search(r"^operation\s+median ms\s+MB/s\s+ratio", out, re.MULTILINE), out
    for operation in ("krum (ours", "multi_krum (ours)", "pairwise distances, double loop, float32",
                      "pairwise distances, double loop, float64",
                      "coordinate_median (ours)", "trimmed_mean beta=0.2 (ours)", r"np.median(stack, axis=0)",
                      "weighted_mean (ours", "sum in place, float32", "sum in place, float64",
                      "geometric_median (ours", "plain numpy Weiszfeld, float64 stack"):
        assert re.search(rf"^{re.escape(operation)}.*\s\d+\.\d\s+\d+", out, re.MULTILINE), (operation, out)
    for rule in RULES.names():  # memory, of every registered rule
        assert re.search(rf"^{rule}\s+\d+\.\d\s+\d+\.\d\s+[+-]\d", out, re.MULTILINE), (rule, out)
    speed_verdicts = re.findall(r"^(PASS|MISS)\s+.*(faster than|no slower than|within 1.5x|does not grow)", out,
                                re.MULTILINE)
    assert len(speed_verdicts) == 7, out
    # (a) accuracy: the grid ran through the engine, one accuracy per cell
    header = re.search(r"^attack\s+attackers\s+mean\s+median\s+krum\s+geometric_median$", out, re.MULTILINE)
    assert header, out
    assert re.search(r"^none\s+0/5 \(0%\)(\s+\d+\.\d\*?){4}\s*$", out, re.MULTILINE), out
    assert re.search(r"^sign_flip\s+1/5 \(20%\)(\s+\d+\.\d\*?){4}\s*$", out, re.MULTILINE), out
    assert "WARNING: the number of agents running an attack differs" not in out
    accuracy_verdicts = re.findall(r"^(PASS|MISS)\s+(median|krum) with 1/5 sign_flip attackers", out, re.MULTILINE)
    assert sorted(v[1] for v in accuracy_verdicts) == ["krum", "median"], out
    # (c) sites: the same agents flat, with the rule inside sites and with the mean inside, under each attack
    assert re.search(r"^attack\s+flat, rule at the root\s+sites, rule inside\s+sites, mean inside$", out, re.MULTILINE)
    for attack in ("none", "sign_flip", "scaling"):
        assert re.search(rf"^{attack}(\s+\d+\.\d\*?){{3}}\s*$", out, re.MULTILINE), (attack, out)
    sites_verdicts = re.findall(r"^(PASS|MISS)\s+median inside 2 sites, one (sign_flip|scaling) attacker", out,
                                re.MULTILINE)
    assert sorted(v[1] for v in sites_verdicts) == ["scaling", "sign_flip"], out
