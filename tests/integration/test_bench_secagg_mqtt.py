"""bench/secagg.py --mqtt --quick runs end to end (Mosquitto, the coordinator process, light agents running
the real SecAgg+ stages) and prints its table; timings are reported, not asserted. What is asserted: every
round completes, each applied mean is within its bound of the exact mean, a masked upload is no larger than
the plain float32 update, and smaller with int8's grid."""

from __future__ import annotations

import re

import pytest

from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_secagg_bench_over_mqtt_unmasks_the_plain_mean_and_int8_uploads_less() -> None:
    out = run_bench("secagg.py", "--mqtt", "--quick", timeout_s=600)
    rows = re.findall(r"^\| 10 x 10,000 \| (\d+)% \| (plain|secure|secure int8) \| [\d.]+ \| [\d.]+x \| [\d./-]+ \| [\d.]+ \| [\d.]+ "
                      r"\| ([\d.]+) \| [\d.]+ \| \d+ \| [\d/-]+ \| (\S+) \| (\S+) \| \S+ \|$", out, re.MULTILINE)
    assert [(r[0], r[1]) for r in rows] == [(rate, mode) for rate in ("0", "10")
                                            for mode in ("plain", "secure", "secure int8")], out
    for _, _, _, error, bound in rows:
        assert float(error) <= float(bound), out
    kb = {(rate, mode): float(up) for rate, mode, up, _, _ in rows}
    # Per agent, everything it sent in the round: the secure rows add keys, bundles and reveals (a few kB).
    assert kb[("0", "secure")] <= kb[("0", "plain")] + 4.0, out
    assert kb[("0", "secure int8")] < 0.5 * kb[("0", "plain")], out  # 12 bits an element for 10 agents, not 32
    assert re.search(r"^PASS every round completed", out, re.MULTILINE), out
    # The goal lines this run can judge: int8's upload at both rates (the 100- and 500-agent goals need those rows).
    assert len(re.findall(r"^PASS with int8 an agent uploads less than in a plain round \(10 agents, (?:0|10)%\)",
                          out, re.MULTILINE)) == 2, out
    assert "at 100 agents" not in out and "500 agents complete" not in out, out
