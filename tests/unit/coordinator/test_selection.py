"""Seeded client sampling: deterministic, order-independent, and of the configured size."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.fleet.selection import plan_selection, select_agents

FAST = settings(deadline=None, max_examples=80)

agent_pools = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), unique=True, max_size=40)
seeds = st.integers(0, 2**32 - 1)
round_numbers = st.integers(0, 10_000_000)
# Fractions as an operator writes them (two decimals), so the exact ceiling is known.
percentages = st.integers(0, 100)


def expected_size(n: int, percent: int, minimum: int) -> int:
    return min(n, max(minimum, math.ceil(Fraction(percent, 100) * n)))


@FAST
@given(agent_pools, round_numbers, seeds, percentages, st.integers(0, 50))
def test_size_is_max_of_minimum_and_ceil_fraction_capped_at_n(
    pool: list[str], round_number: int, seed: int, percent: int, minimum: int
) -> None:
    chosen = select_agents(pool, round_number, seed=seed, fraction=percent / 100, minimum=minimum)
    assert len(chosen) == expected_size(len(pool), percent, minimum)
    assert len(set(chosen)) == len(chosen)
    assert set(chosen) <= set(pool)
    assert chosen == sorted(chosen)


@pytest.mark.parametrize(
    ("fraction", "n", "size"),
    [(0.07, 100, 7), (0.14, 50, 7), (0.28, 25, 7), (0.1, 30, 3), (0.5, 3, 2), (0.01, 1, 1), (0.0, 10, 0),
     (1.0, 10, 10), (0.333, 3, 1), (0.34, 3, 2)],
)
def test_size_uses_the_fraction_as_written(fraction: float, n: int, size: int) -> None:
    # 0.07 * 100 is 7.000000000000001 in binary floating point; the operator meant 7 agents.
    pool = [f"agent-{i}" for i in range(n)]
    assert len(select_agents(pool, 0, seed=1, fraction=fraction, minimum=0)) == size


@FAST
@given(agent_pools, round_numbers, seeds, percentages, st.integers(0, 10), st.randoms(use_true_random=False))
def test_same_seed_and_round_give_the_same_agents_in_any_input_order(
    pool: list[str], round_number: int, seed: int, percent: int, minimum: int, rng: random.Random
) -> None:
    first = select_agents(pool, round_number, seed=seed, fraction=percent / 100, minimum=minimum)
    shuffled = list(pool)
    rng.shuffle(shuffled)
    assert select_agents(shuffled, round_number, seed=seed, fraction=percent / 100, minimum=minimum) == first
    assert select_agents(tuple(pool), round_number, seed=seed, fraction=percent / 100, minimum=minimum) == first


def test_rounds_and_seeds_change_the_selection() -> None:
    pool = [f"agent-{i:02d}" for i in range(30)]
    by_round = {tuple(select_agents(pool, r, seed=5, fraction=0.2, minimum=1)) for r in range(20)}
    by_seed = {tuple(select_agents(pool, 3, seed=s, fraction=0.2, minimum=1)) for s in range(20)}
    # 20 draws of 6 of 30 (593,775 possible subsets): collisions would point at a broken seed.
    assert len(by_round) == 20
    assert len(by_seed) == 20


def test_every_agent_is_eventually_selected() -> None:
    pool = [f"agent-{i:02d}" for i in range(20)]
    seen = set()
    for r in range(100):
        seen.update(select_agents(pool, r, seed=0, fraction=0.1, minimum=1))
    assert seen == set(pool)


def test_empty_pool_selects_nobody() -> None:
    assert select_agents([], 0, seed=0, fraction=1.0, minimum=3) == []


@FAST
@given(agent_pools, round_numbers, seeds, percentages, st.integers(0, 50), st.integers(0, 200))
def test_over_selection_adds_agents_on_top_of_the_wanted_number(
    pool: list[str], round_number: int, seed: int, percent: int, minimum: int, extra_percent: int
) -> None:
    plan = plan_selection(pool, round_number, seed=seed, fraction=percent / 100, minimum=minimum,
                          over_selection=extra_percent / 100)
    wanted = expected_size(len(pool), percent, minimum)
    assert plan.wanted == wanted
    assert len(plan.selected) == min(len(pool), math.ceil(Fraction(wanted) * Fraction(100 + extra_percent, 100)))
    assert plan.selected == sorted(set(plan.selected)) and set(plan.selected) <= set(pool)
    # Without over-selection the plan is exactly the plain selection.
    plain = select_agents(pool, round_number, seed=seed, fraction=percent / 100, minimum=minimum)
    assert plan_selection(pool, round_number, seed=seed, fraction=percent / 100, minimum=minimum).selected == plain
