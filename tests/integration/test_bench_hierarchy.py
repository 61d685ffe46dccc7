"""bench/hierarchy.py --quick runs end to end (a root Mosquitto, a bridged Mosquitto and a site aggregator per site,
the root coordinator, light agents) and prints its table; timings are reported, not asserted. What is asserted:
the final state with sites equals flat's (under SCAFFOLD the server control variate too), no update is lost or
counted twice, and fewer bytes reach the root."""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_hierarchy_bench_quick_matches_flat_with_fewer_bytes_into_the_root(algorithm: str) -> None:
    out = run_bench("hierarchy.py", "--quick", "--algorithm", algorithm, timeout_s=600)
    assert f"rounds (the first bootstraps), {algorithm}, mean (quick)" in out, out
    assert re.search(r"^run\s+round s\s+root CPU s/rd\s+root RSS MB\s+root in kB/rd\s+broker in kB/rd", out,
                     re.MULTILINE), out
    rows = dict(re.findall(r"^(flat 40|2 sites x 20)\s+\d+\.\d+.*\s(\d+/\d+)\s+ok$", out, re.MULTILINE))
    assert rows == {"flat 40": "120/120", "2 sites x 20": "120/120"}, out  # 3 rounds x 40 agents, all counted
    assert re.search(r"^PASS\s+final state with sites equals flat's", out, re.MULTILINE), out
    assert re.search(r"^PASS\s+every acknowledged update counted once", out, re.MULTILINE), out
    assert re.search(r"^PASS\s+bytes into the root broker per round, flat / sites > 1:", out, re.MULTILINE), out
    root_in = dict(re.findall(r"^(flat 40|2 sites x 20)\s+\S+\s+\S+\s+\S+\s+(\d+\.\d)\s", out, re.MULTILINE))
    assert float(root_in["2 sites x 20"]) < float(root_in["flat 40"]), out
