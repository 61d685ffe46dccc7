"""bench/secagg.py --quick runs, prints its table, and every unmasked sum is exact (timings are not asserted)."""

from __future__ import annotations

import re

from tests.bench_runner import run_bench


def test_secagg_bench_quick_is_exact_and_prints_its_table() -> None:
    out = run_bench("secagg.py", "--quick", timeout_s=300)
    assert re.search(r"^\| agents \| dropped \| k/t \|", out, re.MULTILINE), out
    rows = re.findall(r"^\| (\d+) \| (\d+) \| \d+/\d+ \|.*\| ([\d,]+) \| ([\d,]+) \| [\d,]+ \| \d+ \| (\S+) \| (\S+) \| (\w+) \|$",
                      out, re.MULTILINE)
    assert [(int(r[0]), int(r[1])) for r in rows] == [(10, 0), (10, 1), (50, 0), (50, 5)], out
    for _, _, masked, plain, error, bound, exact in rows:
        assert exact == "yes", out
        assert int(masked.replace(",", "")) <= int(plain.replace(",", "")), "a masked upload outgrew the float32 one"
        assert float(error) <= float(bound), out
    assert re.search(r"^PASS every unmasked sum equals", out, re.MULTILINE), out
