"""bench/memory.py --quick runs real phone agents (DP off and on) against Mosquitto and prints its table.

Memory figures are not asserted (they depend on the machine, its kernel and the torch build);
which heavy packages each agent loaded is, through the table the bench prints, with the agent's
library pages given back and kept.
"""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_memory_bench_quick_prints_phone_rows_with_and_without_dp() -> None:
    out = run_bench("memory.py", "--quick", timeout_s=600)
    assert re.search(r"^profile\s+DP\s+give back\s+family\s+peak RSS MiB\s+x torch\s+end RSS\s+anon\s+file\s+heavy"
                     r"\s+modules$", out, re.MULTILINE), out
    assert re.search(r"^python -c 'import torch'\s+\d+\s+1\.00\s+\d+\s+\d+\s+\d+$", out, re.MULTILINE), out
    rows = {(m.group(1), m.group(2)): m for m in re.finditer(
        r"^phone\s+(off|on)\s+(off|on)\s+mlp_tiny\s+(\d+)\s+(\d+\.\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(.*)$",
        out, re.MULTILINE)}
    assert set(rows) == {("off", "on"), ("off", "off"), ("on", "on"), ("on", "off")}, out
    for give_back in ("on", "off"):
        assert rows["off", give_back].group(9).split(", ") == ["torch"]  # no opacus, scipy, sklearn, sympy, dynamo
        with_dp = set(rows["on", give_back].group(9).split(", "))
        assert {"torch", "opacus"} <= with_dp and not {"sklearn", "pandas", "torch._dynamo"} & with_dp
    assert not re.search(r"^(jetson|rpi|cpu)\s", out, re.MULTILINE), "--quick measures the phone profile only"
    assert len(re.findall(r"^(PASS|MISS)\s+phone, DP (off|on): peak RSS \d+ MiB", out, re.MULTILINE)) == 2, out
