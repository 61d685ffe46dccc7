"""The local learning rate each round announces: ``learning_rate`` decayed once a round, down to a floor."""

from __future__ import annotations

LEAST_LEARNING_RATE = 1e-6
"""Where ``learning_rate_decay`` stops: below it a round trains nothing, and a long run's power would underflow
to 0, which the wire refuses."""


def round_learning_rate(learning_rate: float, decay: float, round_number: int) -> float:
    """Round ``round_number``'s (from 1) local learning rate: ``learning_rate x decay^(round_number - 1)``."""
    return max(learning_rate * decay ** (round_number - 1), LEAST_LEARNING_RATE)


def decay_problem(learning_rate: float, decay: float, rounds: int) -> str | None:
    """Why ``decay`` over ``rounds`` cannot run (its last rounds would sit at the floor); None if it can."""
    last = learning_rate * decay ** (rounds - 1)
    if last >= LEAST_LEARNING_RATE:
        return None
    return (f"learning_rate_decay {decay:g} over {rounds} rounds takes the local learning rate from {learning_rate:g} "
            f"to {last:.2g}, below {LEAST_LEARNING_RATE:g}: the last rounds would train nothing; raise "
            f"learning_rate_decay")
