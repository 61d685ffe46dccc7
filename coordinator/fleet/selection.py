"""Seeded client sampling: the same seed and round always pick the same agents."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from protocol.messages import MAX_AGENTS_PER_ROUND


@dataclass(frozen=True)
class Selection:
    selected: list[str]
    """Agents asked to train, sorted."""
    wanted: int
    """Updates the round needs to close early; below ``len(selected)`` when over-selecting."""


def wanted_count(available: int, *, fraction: float, minimum: int) -> int:
    """``max(minimum, ceil(fraction * available))``, at most ``available``."""
    # Round away binary floating-point noise first: 0.07 * 100 is 7.000000000000001, not 7.
    return min(available, max(minimum, math.ceil(round(fraction * available, 9))))


def select_agents(
    available: Sequence[str], round_number: int, *, seed: int, fraction: float, minimum: int,
    over_selection: float = 0.0, maximum: int = MAX_AGENTS_PER_ROUND,
) -> list[str]:
    """Pick the agents of :func:`plan_selection` (without the wanted count)."""
    return plan_selection(available, round_number, seed=seed, fraction=fraction, minimum=minimum,
                          over_selection=over_selection, maximum=maximum).selected


def plan_selection(
    available: Sequence[str], round_number: int, *, seed: int, fraction: float, minimum: int,
    over_selection: float = 0.0, maximum: int = MAX_AGENTS_PER_ROUND,
) -> Selection:
    """Want ``max(minimum, ceil(fraction * n))`` updates; select ``ceil(wanted * (1 + over_selection))``;
    never more than ``maximum`` (what one announcement may name), however large the fleet.

    Over-selection asks a few more agents than the round needs, so that the round can close
    as soon as the wanted number answered instead of waiting for its slowest members. The
    generator is seeded with (seed, round), so a restarted coordinator re-selects the same
    agents for a round, and the choice does not depend on arrival order.
    """
    if not 1 <= maximum <= MAX_AGENTS_PER_ROUND:
        raise ValueError(f"maximum must be in [1, {MAX_AGENTS_PER_ROUND}], got {maximum}")
    pool = sorted(available)
    wanted = min(maximum, wanted_count(len(pool), fraction=fraction, minimum=minimum))
    count = min(len(pool), maximum, math.ceil(round(wanted * (1.0 + over_selection), 9)))
    rng = np.random.default_rng([seed, round_number])
    chosen = rng.choice(len(pool), size=count, replace=False) if count else []
    return Selection(sorted(pool[i] for i in chosen), wanted)
