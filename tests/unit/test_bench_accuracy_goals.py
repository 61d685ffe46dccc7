"""bench/task_accuracy.py's goal lines against hand-made results: each verdict compares what it says."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from launcher.scenarios import ScenarioResult
from tests.chart import REPO


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("task_accuracy", REPO / "bench" / "task_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("task_accuracy", module)
    spec.loader.exec_module(module)
    return module


def result(accuracy: float, curve: list[float] | None = None, upload: float | None = None) -> ScenarioResult:
    return ScenarioResult(accuracy, curve or [accuracy], upload_bytes=upload)


def table(scaffold_curve: list[float], few: dict[int, tuple[float, float]]) -> dict[str, ScenarioResult]:
    results = {"central": result(0.976), "fedavg-iid": result(0.965), "fedavg-0.1": result(0.956),
               "fedprox-0.1": result(0.950), "scaffold-0.1": result(scaffold_curve[-1], scaffold_curve),
               "fedproto": result(0.973, upload=2900.0), "alone": result(0.969)}
    for seed, (proto, alone) in few.items():
        results[f"fedproto-few-s{seed}"], results[f"alone-few-s{seed}"] = result(proto), result(alone)
    return results


def test_each_goal_compares_the_rows_it_names(bench: ModuleType) -> None:
    plan = bench.plan_for("mnist-5k", quick=False)
    steady = [0.5 + 0.01 * i for i in range(30)]  # ends at 0.79: below FedAvg's 0.956
    verdicts = bench.goals(plan, table(steady, {0: (0.90, 0.85), 1: (0.88, 0.86), 2: (0.86, 0.87)}), 2560)
    assert [(ok, text.split(":")[0]) for ok, text in verdicts] == [
        (True, "centralised at least 97%"),
        (True, "FedAvg IID within 1.5 points of centralised"),
        (False, "FedProx at or above FedAvg at Dir(0.1)"),
        (False, "SCAFFOLD at or above FedAvg at Dir(0.1), mean over 1 seed(s)"),
        (True, "SCAFFOLD at Dir(0.1) after round 10"),
        (True, "FedProto at or above alone, 3 classes/agent"),
        (True, "FedProto upload within 2 KB of classes x dim x 4 = 2560 B"),
        (False, "FedProto at least 3 points above alone, few-shot (<=15/class), mean over 3 seeds"),
        (False, "FedProto at or above alone in every few-shot seed"),
    ]
    assert verdicts[7][1].endswith("+2.00 points") and verdicts[8][1].endswith("+5.00, +2.00, -1.00 points")


def test_a_swing_after_round_ten_misses_and_one_before_does_not(bench: ModuleType) -> None:
    plan = bench.plan_for("mnist-5k", quick=False)
    early = [0.2, 0.9, 0.3] + [0.96] * 27  # swings, but only before round 10
    late = [0.96] * 12 + [0.90] + [0.96] * 17  # a 6-point fall from round 12 to 13
    by_goal = {}
    for name, curve in (("early", early), ("late", late)):
        verdicts = bench.goals(plan, table(curve, {0: (0.9, 0.8)}), 2560)
        by_goal[name] = next((ok, text) for ok, text in verdicts if text.startswith("SCAFFOLD at Dir(0.1) after"))
    assert by_goal["early"] == (True, by_goal["early"][1]) and by_goal["early"][1].endswith("largest s0 0.00")
    assert by_goal["late"][0] is False and by_goal["late"][1].endswith("largest s0 6.00")
    assert all(ok for ok, text in bench.goals(plan, table(early, {0: (0.9, 0.8)}), 2560) if "few-shot" in text)


def test_goals_of_rows_that_did_not_run_are_left_out(bench: ModuleType) -> None:
    plan = bench.plan_for("basic-motions", quick=True)  # no thresholds of its own: only the comparisons
    only_few = {"fedproto-few-s0": result(0.7), "alone-few-s0": result(0.6)}
    verdicts = bench.goals(plan, only_few, 512)
    assert [text.split(" (")[0].split(":")[0] for _, text in verdicts] == [
        "FedProto at least 3 points above alone, few-shot", "FedProto at or above alone in every few-shot seed"]
    assert all(ok for ok, _ in verdicts)


def test_the_scaffold_goals_take_the_mean_over_seeds_and_the_fall_of_each(bench: ModuleType) -> None:
    """SCAFFOLD behind FedAvg on seed 0 but ahead on the mean of three seeds meets the first goal; a late fall in
    any one seed misses the second."""
    plan = bench.plan_for("mnist-5k", quick=False)
    steady = [0.95] * 30
    results = table(steady, {})
    results["fedavg-0.1"] = result(0.957)  # seed 0: FedAvg ahead of SCAFFOLD's 0.95
    for seed, fedavg, scaffold in ((1, 0.893, 0.956), (2, 0.929, 0.964)):
        curve = [scaffold] * 30 if seed == 1 else [scaffold] * 20 + [0.90] + [scaffold] * 9  # s2 falls 6.4 late
        results[f"fedavg-0.1-s{seed}"], results[f"scaffold-0.1-s{seed}"] = result(fedavg), result(scaffold, curve)
    verdicts = {text.split(":")[0]: (ok, text) for ok, text in bench.goals(plan, results, 2560)}
    mean_ok, mean_text = verdicts["SCAFFOLD at or above FedAvg at Dir(0.1), mean over 3 seed(s)"]
    assert mean_ok and "95.67% vs 92.63% (+3.03 points; s0 95.00% vs 95.70%" in mean_text, mean_text
    fall_ok, fall_text = verdicts["SCAFFOLD at Dir(0.1) after round 10"]
    assert not fall_ok and fall_text.endswith("largest s0 0.00, s1 0.00, s2 6.40"), fall_text
