"""bench/flood.py --quick runs end to end (a real Mosquitto, the coordinator and three agents as their own
processes, the flooder as another) and prints its table; round times and rates are reported, not asserted."""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUMBER = r"[+-]?\d+\.\d\d"


def test_flood_bench_quick_prints_its_table() -> None:
    out = run_bench("flood.py", "--quick", timeout_s=600)
    assert re.search(r"^round\s+task\s+baseline s\s+flood s\s+ratio\s+delay s\s+lag base s\s+lag flood s\s+"
                     r"baseline\s+flood\s*$", out, re.MULTILINE), out
    rows = re.findall(rf"^\s+(\d+)\s+(train|evaluate)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+"
                      rf"(?:{NUMBER}|-)\s+(?:{NUMBER}|-)\s+(\w+)\s+(\w+)\s*$", out, re.MULTILINE)
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5, 6], out  # 5 training rounds and the final evaluation
    assert rows[-1][1] == "evaluate", out
    assert re.search(r"^flood: 3,000 messages \([\d,]+ statuses, [\d,]+ updates\) from 50 keys", out, re.MULTILINE), out
    assert re.search(r"^sent\s+[\d,]+ msg/s", out, re.MULTILINE), out
    assert re.search(r"^received\s+[\d,]+ msg/s", out, re.MULTILINE), out  # the coordinator counted all of it
    assert re.search(r"^rejected\s+3,000 as unknown_signer, 0 as sender_backlog$", out, re.MULTILINE), out
    assert re.search(r"^lag\s+largest", out, re.MULTILINE), out
    assert "ERROR" not in out, out
    verdicts = re.findall(r"^(PASS|MISS)\s+(the flood delays no round|no round misses its quorum)", out, re.MULTILINE)
    assert sorted(v[1] for v in verdicts) == ["no round misses its quorum", "the flood delays no round"], out
