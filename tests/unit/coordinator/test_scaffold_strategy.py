"""SCAFFOLD on the coordinator: the server variate's 1/N scaling, the global step, the checks."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.admission.decisions import Reject
from coordinator.aggregation import weighted_mean
from coordinator.settings import CoordinatorSettings
from coordinator.strategies import FedProx, Scaffold, build_strategy
from protocol.messages import TrainMetrics, Update
from tests.task_refs import DIGITS


def arrays(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 2), value, np.float32), "b": np.full(2, value, np.float32),
            "count": np.array(3, np.int64)}


def control(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 2), value, np.float32), "b": np.full(2, value, np.float32)}


def scaffold_update(agent: str, samples: int, base: str | None, **payload: object) -> Update:
    return Update(run_id="r", agent_id=agent, round=1, task="train", task_ref=DIGITS, family="f", base_digest=base,
                  num_samples=samples, metrics=TrainMetrics(), **payload)  # type: ignore[arg-type]


def bootstrapped(population: int = 4) -> Scaffold:
    strategy = Scaffold(weighted_mean, server_learning_rate=0.5)
    # A bootstrap proposal is agreed on whole (weights and control delta), never averaged.
    strategy.aggregate(1, [scaffold_update("a", 10, None, weights=arrays(2.5), control_delta=control(3.0)),
                           scaffold_update("b", 30, None, weights=arrays(2.5), control_delta=control(3.0))],
                       population={"f": population})
    return strategy


def test_bootstrap_takes_the_agreed_weights_and_scales_the_control_by_answered_over_known() -> None:
    state = bootstrapped(population=4).states["f"]
    np.testing.assert_allclose(state.weights["w"], 2.5)  # the agreed proposal, no global step at bootstrap
    np.testing.assert_allclose(state.control["w"], 2 / 4 * 3.0)  # |S|/N * the agreed dc
    assert sorted(state.control) == ["b", "w"] and state.weights["count"].shape == ()


def test_a_round_takes_a_global_step_and_moves_the_variate_by_s_over_n() -> None:
    strategy = bootstrapped(population=4)
    before = strategy.states["f"]
    digest = before.digest
    updates = [scaffold_update("a", 10, digest, delta=arrays(1.0), control_delta=control(-1.0)),
               scaffold_update("c", 10, digest, delta=arrays(3.0), control_delta=control(0.0)),
               scaffold_update("d", 20, digest, delta=arrays(0.0), control_delta=control(0.5))]
    for update in updates:
        assert strategy.check_update(update) is None
    strategy.aggregate(2, updates, population={"f": 4})
    after = strategy.states["f"]
    mean_delta = (10 * 1 + 10 * 3 + 0) / 40
    np.testing.assert_allclose(after.weights["w"], before.weights["w"] + 0.5 * mean_delta, rtol=1e-6)
    mean_control_delta = (10 * -1.0 + 10 * 0.0 + 20 * 0.5) / 40  # weighted like the deltas (test_scaffold_reference.py)
    np.testing.assert_allclose(after.control["w"], before.control["w"] + 3 / 4 * mean_control_delta, rtol=1e-6)
    assert after.round == 3


def test_the_population_never_counts_fewer_agents_than_answered() -> None:
    state = bootstrapped(population=1).states["f"]  # stale count: 2 answered
    np.testing.assert_allclose(state.control["w"], 3.0)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"delta": arrays(1.0)}, "missing_payload"),
        ({"delta": arrays(1.0), "control_delta": {"w": np.zeros((2, 2), np.float32)}}, "bad_shape"),
        ({"delta": arrays(1.0), "control_delta": control(1.0) | {"count": np.array(1, np.int64)}}, "bad_shape"),
    ],
)
def test_updates_must_carry_a_variate_shaped_like_the_server_one(payload: dict, reason: str) -> None:
    strategy = bootstrapped()
    assert_rejected(reason, strategy.check_update(scaffold_update("a", 10, strategy.states["f"].digest, **payload)))


def test_bootstrap_variates_must_name_parameters_of_the_sent_model() -> None:
    strategy = Scaffold(weighted_mean)
    assert_rejected("no parameter", strategy.check_update(scaffold_update("a", 1, None, weights=arrays(1.0),
                                              control_delta={"x": np.zeros(2, np.float32)})))
    assert_rejected("bad_shape", strategy.check_update(scaffold_update("a", 1, None, weights=arrays(1.0),
                                              control_delta={"count": np.array(1, np.int64)})))


def test_checkpointed_state_round_trips_and_a_bad_variate_is_refused() -> None:
    strategy = bootstrapped()
    restored = Scaffold(weighted_mean)
    restored.load_state_dict(strategy.state_dict())
    assert restored.states["f"].digest == strategy.states["f"].digest
    data = strategy.state_dict()
    data["families"]["f"]["control"]["w"] = np.zeros(7, np.float32)
    with pytest.raises(ValueError, match="checkpointed control"):
        Scaffold(weighted_mean).load_state_dict(data)


def test_settings_pick_the_strategy_and_scaffolds_momentum() -> None:
    assert isinstance(build_strategy(CoordinatorSettings(algorithm="scaffold")), Scaffold)
    assert CoordinatorSettings(algorithm="scaffold").momentum == 0.0
    assert CoordinatorSettings(algorithm="fedavg").momentum == 0.9
    prox = build_strategy(CoordinatorSettings(algorithm="fedprox", prox_mu=0.3))
    assert isinstance(prox, FedProx) and prox.round_params(1) == {"mu": 0.3}
    assert CoordinatorSettings(algorithm="scaffold", momentum=0.9).momentum == 0.9


def assert_rejected(pattern: str, problem: Reject | None) -> None:
    """The check refused, and its reason and detail match ``pattern``."""
    import re

    assert problem is not None and re.search(pattern, f"{problem.reason.value}: {problem.detail}"), problem


def test_a_head_left_uncorrected_is_announced_and_the_papers_scaffold_announces_nothing() -> None:
    """``scaffold_correct_head`` false travels as the round's ``correct_head`` param; the default sends none, so a
    round of the paper's algorithm reads as it did before the option existed."""
    base = {"federation": "t", "enrollment": "open", "algorithm": "scaffold", "momentum": 0.0}
    assert build_strategy(CoordinatorSettings(**base)).round_params(3) == {}
    assert build_strategy(CoordinatorSettings(**base, scaffold_correct_head=False)).round_params(3) == {
        "correct_head": False}
    assert build_strategy(CoordinatorSettings(**base, scaffold_absent_class_scale=0.5)).round_params(3) == {
        "absent_class_scale": 0.5}
    assert build_strategy(CoordinatorSettings(**base, scaffold_correct_head=False, scaffold_absent_class_scale=0.25)
                          ).round_params(3) == {"correct_head": False, "absent_class_scale": 0.25}


@pytest.mark.parametrize("scale", [0.0, 1.5])
def test_an_absent_class_scale_outside_zero_to_one_fails_at_start_up_naming_it(scale: float) -> None:
    with pytest.raises(ValidationError, match="scaffold_absent_class_scale"):
        CoordinatorSettings(federation="t", enrollment="open", algorithm="scaffold",
                            scaffold_absent_class_scale=scale)
