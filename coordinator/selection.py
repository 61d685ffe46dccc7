"""Seeded client sampling: the same seed and round always pick the same agents."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def select_agents(
    available: Sequence[str], round_number: int, *, seed: int, fraction: float, minimum: int,
) -> list[str]:
    """Pick ``max(minimum, ceil(fraction * n))`` of ``available`` (at most all of them).

    The generator is seeded with (seed, round), so a restarted coordinator re-selects the
    same agents for a round, and the choice does not depend on arrival order.
    """
    pool = sorted(available)
    # Round away binary floating-point noise first: 0.07 * 100 is 7.000000000000001, not 7.
    count = min(len(pool), max(minimum, math.ceil(round(fraction * len(pool), 9))))
    rng = np.random.default_rng([seed, round_number])
    chosen = rng.choice(len(pool), size=count, replace=False) if count else []
    return sorted(pool[i] for i in chosen)
