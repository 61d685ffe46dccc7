"""bench/secagg.py --accuracy --quick runs end to end (a real Mosquitto, the real coordinator and agents on
threads): the same digits fleet trains once plainly and once with secure aggregation, and one table holds both;
with FedAvg (one family) and with FedProto (three model families, prototypes masked as per-class sums). After 3 rounds of a small model the accuracy goal means little and timings are the machine's, so
neither is asserted; what is: both runs completed every round, the secure one aggregated every round after
the bootstrap securely and the plain one none, each row prints an accuracy, and the goal line is judged
from the printed difference."""

from __future__ import annotations

import re

import pytest

from protocol.secagg.accounting import epsilon_of, gaussian_rdp
from tests.bench_runner import run_bench

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 3  # the quick plan's; under FedAvg round 1 is the bootstrap (seeded weights, plain by design)


@pytest.mark.parametrize("algorithm, name, plain_first, noise", [
    ("fedavg", "FedAvg", 1, None), ("fedproto", "FedProto", 0, None), ("fedavg", "FedAvg", 1, 2.0)],
    ids=["fedavg", "fedproto", "fedavg-distributed-dp"])
def test_secagg_accuracy_bench_quick_runs_plain_and_secure_into_one_table(algorithm: str, name: str,
                                                                          plain_first: int, noise: float | None) -> None:
    """``plain_first``: FedAvg's round 1 bootstraps in the clear (seeded weights); FedProto's is secure already.
    ``noise``: the secure run adds distributed DP noise (4 agents: it learns nothing, so only the plain run's
    accuracy is asserted; the ledger's epsilon is, for its 2 noisy sums)."""
    extra = ["--noise", str(noise), "--clip-norm", "1.0"] if noise else []
    out = run_bench("secagg.py", "--accuracy", "--quick", "--algorithm", algorithm, *extra, timeout_s=600)
    rows = re.findall(rf"^\| (plain|secure) {name} \| (\d+\.\d\d)% \| (\d+)/(\d+) \| (\d+)/(\d+) \| [\d.]+ \| \d+ \|$",
                      out, re.MULTILINE)
    assert [r[0] for r in rows] == ["plain", "secure"], out
    accuracy = {mode: float(acc) for mode, acc, *_ in rows}
    for mode, _, done, trained, secure, of in rows:
        assert int(done) == int(trained) == int(of) == ROUNDS, (mode, out)
        assert int(secure) == (ROUNDS - plain_first if mode == "secure" else 0), (mode, out)
    learned = ["plain"] if noise else ["plain", "secure"]
    assert all(10.0 < accuracy[mode] <= 100.0 for mode in learned), out  # past chance (10 classes)
    if noise:
        dp = re.search(r"^distributed DP \(skellam\): noise multiplier ([\d.]+), clip norm 1, split (\d+) ways; "
                       r"epsilon ([\d.]+) at delta 1e-05 after 2 noisy sums", out, re.MULTILINE)
        assert dp and float(dp.group(1)) == noise, out
        # Skellam noise on a grid this fine costs what the Gaussian mechanism would, and never less.
        gaussian = epsilon_of(gaussian_rdp(noise, 2), 1e-5)[0]
        assert gaussian * (1 - 1e-3) <= float(dp.group(3)) <= gaussian * 1.01, out
    difference = re.search(r"^difference secure - plain: ([+-]\d+\.\d\d) points", out, re.MULTILINE)
    assert difference, out
    assert abs(float(difference.group(1)) - (accuracy["secure"] - accuracy["plain"])) <= 0.02, out
    verdict = re.search(rf"^(PASS|MISS)  secure {name} within 0.5 points of plain {name} after 3 rounds", out,
                        re.MULTILINE)
    assert verdict and (verdict.group(1) == "PASS") == (abs(float(difference.group(1))) <= 0.5), out
    assert re.search(r"^round time secure / plain: \d+\.\d\dx", out, re.MULTILINE), out
    probes = re.findall(r"^clip probe, .*: largest \|(?:delta|value)\| (\d+\.\d+), (\d+\.\d+)% of values over", out,
                        re.MULTILINE)
    assert len(probes) == 2 and all(float(largest) > 0 for largest, _ in probes), out
    assert "FAIL" not in out
