"""Federated evaluation against agents that lie about their held-out metrics (found in review): a loss near the float
limit made the round's loss infinite (a +Inf gauge, a non-JSON ``Infinity`` in rounds.jsonl) and any finite loss
set the fleet's; of two reporting agents, the liar's sample claim capped nothing (the median of two is their mean);
``claim_cap_multiple`` 0 took evaluation counts as reported. Driven through the engine harness, each update through
the real encode, decode and validation, the real RoundsLog writing rounds.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from coordinator.state.rounds_log import RoundsLog
from coordinator.telemetry.evaluation import federated_metrics
from protocol.messages import TrainMetrics, Update
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import Clock, hello, make_engine, send, update

HONEST = dict(eval_loss=0.3, eval_accuracy=0.9, num_eval_samples=50, train_loss=0.2)


def one_round(tmp_path: Path, reports: dict[str, dict], samples: int = 10, **settings: object):
    """Every agent in ``reports`` says hello, is selected, and answers round 1 with those TrainMetrics fields.
    Returns (engine, metrics registry, rounds.jsonl path)."""
    n = len(reports)
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, min_available_agents=n, min_fit_agents=n, **settings)
    log_path = tmp_path / "rounds.jsonl"
    engine.on_round_closed = RoundsLog(log_path).append  # what CoordinatorService wires
    for agent in reports:
        hello(engine, agent, samples=samples)
    engine.tick()
    assert engine.open is not None and sorted(engine.open.selected) == sorted(reports)
    for agent, fields in reports.items():
        u = update(engine, agent, 1, samples=samples)
        send(engine, u.model_copy(update={"metrics": TrainMetrics(**fields)}))
    engine.tick()
    assert engine.last_summary is not None and engine.last_summary.round == 1
    assert engine.last_summary.outcome == "completed"
    return engine, metrics, log_path


def strict_json(line: str) -> object:
    def bad(const: str) -> None:
        raise ValueError(f"non-standard JSON constant {const!r}")
    return json.loads(line, parse_constant=bad)


def evaluation(agent: str, accuracy: float, n: int) -> Update:
    return Update(run_id="r", agent_id=agent, round=9, task="evaluate", task_ref=DIGITS, family="f", base_digest=None,
                  num_samples=0, metrics=TrainMetrics(eval_accuracy=accuracy, eval_loss=1 - accuracy,
                                                      num_eval_samples=n))
def test_huge_eval_loss_does_not_make_the_round_loss_infinite(tmp_path: Path) -> None:
    engine, metrics, log_path = one_round(tmp_path, {
        "a": HONEST, "b": HONEST,
        "liar": dict(eval_loss=1.7e308, eval_accuracy=0.9, num_eval_samples=50, train_loss=0.2),
    })
    s = engine.last_summary
    gauge = metrics.registry.get_sample_value("fl_federated_loss", {"family": "all"})
    assert s.loss is None or math.isfinite(s.loss), s.loss
    assert gauge is None or math.isfinite(gauge), gauge
    for line in log_path.read_text().splitlines():
        strict_json(line)  # rounds.jsonl must stay standard JSON


def test_huge_train_loss_does_not_make_the_round_train_loss_infinite(tmp_path: Path) -> None:
    engine, _, log_path = one_round(tmp_path, {
        "a": HONEST, "b": HONEST,
        "liar": dict(eval_loss=0.3, eval_accuracy=0.9, num_eval_samples=50, train_loss=1.7e308),
    })
    s = engine.last_summary
    assert s.train_loss is None or math.isfinite(s.train_loss), s.train_loss
    for line in log_path.read_text().splitlines():
        strict_json(line)


def test_one_agent_cannot_set_the_fleet_loss_to_any_value(tmp_path: Path) -> None:
    """Finite but absurd: one of three agents moves the weighted loss from 0.3 to ~1e299 (accuracy's influence
    is bounded by [0, 1]; loss's is not)."""
    engine, _, _ = one_round(tmp_path, {
        "a": HONEST, "b": HONEST,
        "liar": dict(eval_loss=1e300, eval_accuracy=0.9, num_eval_samples=50, train_loss=0.2),
    })
    assert engine.last_summary.loss < 1e6, engine.last_summary.loss


def test_evaluation_stays_bounded_when_the_claim_cap_is_off(tmp_path: Path) -> None:
    honest = dict(eval_loss=0.1, eval_accuracy=0.9, num_eval_samples=50)
    engine, _, _ = one_round(tmp_path, {
        "a": honest, "b": honest, "liar": dict(eval_loss=0.1, eval_accuracy=0.0, num_eval_samples=2**63),
    }, claim_cap_multiple=0, max_samples_per_update=1000)
    # with evaluation's own DEFAULT_CAP_MULTIPLE (2 x median 50) the liar holds 100/200: accuracy 0.45
    assert engine.last_summary.accuracy >= 0.3, engine.last_summary.accuracy


def test_of_two_reporting_agents_the_liar_is_still_capped() -> None:
    report = federated_metrics([evaluation("honest", 0.9, 50), evaluation("liar", 0.0, 2**63)], cap_multiple=2.0)
    # cap_multiple 2 bounds the liar at 2 x 50: the honest agent keeps >= 1/3 of the weight -> accuracy >= 0.3
    assert report.accuracy >= 0.3 - 1e-9, report


def test_engine_round_accuracy_two_agents(tmp_path: Path) -> None:
    engine, metrics, _ = one_round(tmp_path, {
        "a": dict(eval_loss=0.1, eval_accuracy=0.9, num_eval_samples=50),
        "b": dict(eval_loss=0.1, eval_accuracy=0.0, num_eval_samples=2**63),
    })  # default claim_cap_multiple 1.0 -> the honest agent should keep >= 1/2 of the weight
    acc = metrics.registry.get_sample_value("fl_federated_accuracy_ratio", {"family": "all"})
    assert engine.last_summary.accuracy >= 0.45 - 1e-9, engine.last_summary.accuracy
    assert acc >= 0.45 - 1e-9


def _reported(agent: str, loss: float) -> Update:
    return Update.model_construct(agent_id=agent, family="f", num_samples=50, metrics=TrainMetrics(
        eval_loss=loss, eval_accuracy=0.9, num_eval_samples=50, train_loss=loss))


def test_a_loss_of_zero_caps_no_other_agents_loss() -> None:
    """The loss cap rested on the low median: of two agents a liar's 0.0 capped the honest 5.0 at 0, and two agents
    that fit their splits exactly hid a third that diverged (found in review). It rests on the positive losses."""
    two = federated_metrics([_reported("honest", 5.0), _reported("liar", 0.0)])
    assert two.loss == pytest.approx(2.5) and two.train_loss == pytest.approx(2.5)
    three = federated_metrics([_reported("a", 0.0), _reported("b", 0.0), _reported("c", 3.0)])
    assert three.loss == pytest.approx(1.0)
