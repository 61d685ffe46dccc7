"""The local learning rate a round announces: decayed once a round, never below the floor the wire accepts."""

from __future__ import annotations

import pytest

from coordinator.schedule import LEAST_LEARNING_RATE, decay_problem, round_learning_rate
from protocol.messages import LocalTraining


def test_the_rate_decays_once_a_round_from_the_first() -> None:
    assert [round_learning_rate(0.05, 0.9, n) for n in (1, 2, 3)] == pytest.approx([0.05, 0.045, 0.0405])
    assert round_learning_rate(0.05, 1.0, 10_000) == 0.05  # no decay: every round the same


def test_a_long_run_stops_at_the_floor_and_stays_valid_on_the_wire() -> None:
    assert 0.05 * 0.5 ** 2000 == 0.0  # what the plain power would announce
    rate = round_learning_rate(0.05, 0.5, 2001)
    assert rate == LEAST_LEARNING_RATE
    assert LocalTraining(epochs=1, learning_rate=rate).learning_rate == rate


def test_a_decay_whose_last_rounds_would_sit_at_the_floor_is_named() -> None:
    assert decay_problem(0.05, 0.95, 40) is None
    assert decay_problem(0.05, 1.0, 1_000_000) is None
    problem = decay_problem(0.05, 0.5, 40)
    assert problem is not None and "learning_rate_decay 0.5 over 40 rounds" in problem
