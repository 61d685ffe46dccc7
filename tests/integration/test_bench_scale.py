"""bench/scale.py --quick runs end to end (a real Mosquitto, the coordinator as its own process,
light agents) and prints its tables; timings and sizes are reported, not asserted, except that
no update may be lost: every update the broker acknowledged was accepted."""

from __future__ import annotations

import os
import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_scale_bench_quick_prints_grid_and_long_run() -> None:
    out = run_bench("scale.py", "--quick", timeout_s=600)
    assert re.search(r"^agents\s+params\s+aggregator\s+round s.*raw s\s+ratio\s+busy\s+raw busy\s+CPU x\s+RSS MB"
                     r"\s+CPU s/rd\s+accepted/sent", out, re.MULTILINE), out
    rows = re.findall(r"^\s*(\d+)\s+127k\s+(mean|krum)\s+\d+\.\d+\s.*?\s(\d+)/(\d+)\s+(\S.*)$", out, re.MULTILINE)
    assert sorted((int(n), agg) for n, agg, *_ in rows) == [(50, "krum"), (50, "mean"), (300, "krum"), (300, "mean")], out
    for agents, aggregator, accepted, sent, status in rows:
        assert status == "ok", (agents, aggregator, status, out)
        assert int(sent) == int(accepted) == 3 * int(agents), (agents, aggregator, out)  # 3 rounds, all answering
    # where the machine's CPU went, for the mean row the ratio goal applies to (300 agents; 50 is under it)
    assert re.search(r"^300x127k/mean: \d+% of \d+ cores busy over the rounds, \d+% over the replays; the machine's CPU a "
                     r"round \d+\.\d\dx a replay's\. For 1\.3x the coordinator could spend -?\d+\.\d\d CPU ms an update; "
                     r"it spent \d+\.\d\d( \(below zero: .*\))?$", out, re.MULTILINE), out
    assert re.search(r"^  CPU s a round: coordinator \d+\.\d\d, fleet \d+\.\d\d, broker \d+\.\d\d, the rest -?\d+\.\d\d; "
                     r"a replay: sink and the rest -?\d+\.\d\d, fleet \d+\.\d\d, broker \d+\.\d\d$", out, re.MULTILINE), out
    assert not re.search(r"^50x127k/mean:", out, re.MULTILINE), out
    assert re.search(r"^PASS\s+0 lost updates", out, re.MULTILINE), out
    assert re.search(r"^(PASS|MISS)\s+mean round time <= 1.3x raw transport", out, re.MULTILINE), out
    # the long run: 200 rounds closed, both points measured, three flatness verdicts
    assert re.search(r"^long run: 200 of 200 rounds closed$", out, re.MULTILINE), out
    for what in ("median time between rounds", "coordinator RSS", "checkpoint.msgpack"):
        assert re.search(rf"^{what}.*\s\d+\.\d\s+\d+\.\d\s+\d+\.\d\d$", out, re.MULTILINE), (what, out)
    assert len(re.findall(r"^(PASS|MISS)\s+.*flat within 10%", out, re.MULTILINE)) == 3, out


def test_scale_bench_pins_the_coordinator_to_a_core_of_its_own() -> None:
    """--pin: the coordinator process is allowed the last core only (the kernel's word, read once it ran), and the
    notes and the ratio's verdict say the row was pinned."""
    out = run_bench("scale.py", "--pin", "--part", "grid", "--configs", "300x127k/mean", "--rounds", "2",
                    timeout_s=300)
    last = max(os.sched_getaffinity(0))
    assert re.search(rf"^scale benchmark: .*; pinned: the coordinator \(and the raw replays' sink\) on core {last}, "
                     r"the fleet and the broker on core [\d,]+$", out, re.MULTILINE), out
    assert re.search(rf"^300x127k/mean \(pinned\): the coordinator \(allowed core {last}\) kept its core \d+% busy, "
                     r"\d+\.\d\d CPU ms an update; for 1\.3x it has \d+\.\d\d ms of its core's time an update$", out,
                     re.MULTILINE), out
    assert re.search(r"^PASS\s+0 lost updates", out, re.MULTILINE), out
    assert re.search(r"^(PASS|MISS)\s+mean round time <= 1.3x raw transport from 300 agents up \(the coordinator and "
                     r"the sink on a core of their own: --pin\): 300x127k/mean \d+\.\d\d$", out, re.MULTILINE), out
