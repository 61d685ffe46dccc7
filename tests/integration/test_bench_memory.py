"""bench/memory.py --quick runs real phone agents (DP off and on) against Mosquitto and prints its table.

Memory figures are not asserted (they depend on the machine and the torch build); which heavy
packages each agent loaded is, through the table the bench prints.
"""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_memory_bench_quick_prints_phone_rows_with_and_without_dp() -> None:
    out = run_bench("memory.py", "--quick", timeout_s=600)
    assert re.search(r"^profile\s+DP\s+family\s+peak RSS MiB\s+x torch\s+heavy\s+modules$", out, re.MULTILINE), out
    assert re.search(r"^python -c 'import torch'\s+\d+\s+1\.00$", out, re.MULTILINE), out
    rows = {m.group(1): m for m in re.finditer(r"^phone\s+(off|on)\s+mlp_tiny\s+(\d+)\s+(\d+\.\d+)\s+(\d+)\s+(.*)$",
                                               out, re.MULTILINE)}
    assert set(rows) == {"off", "on"}, out
    assert rows["off"].group(5).split(", ") == ["torch"]  # no opacus, scipy, sklearn, pandas, sympy, dynamo
    assert {"torch", "opacus"} <= set(rows["on"].group(5).split(", "))
    assert not {"sklearn", "pandas", "torch._dynamo"} & set(rows["on"].group(5).split(", "))
    assert not re.search(r"^(jetson|rpi|cpu)\s", out, re.MULTILINE), "--quick measures the phone profile only"
    assert len(re.findall(r"^(PASS|MISS)\s+phone, DP (off|on): peak RSS \d+ MiB", out, re.MULTILINE)) == 2, out
