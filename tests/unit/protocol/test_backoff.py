"""Reconnect back-off: exponential ceiling, full jitter, reset after a successful connect."""

from __future__ import annotations

import random

from protocol.transport.mqtt import Backoff


def test_delays_are_jittered_below_a_doubling_ceiling_up_to_the_cap() -> None:
    backoff = Backoff(base_s=0.5, cap_s=8.0, rng=random.Random(1))
    ceilings = [0.5, 1, 2, 4, 8, 8, 8]
    runs = []
    for seed in range(200):
        fresh = Backoff(0.5, 8.0, random.Random(seed))
        runs.append([fresh.next_delay() for _ in ceilings])
    for attempt, ceiling in enumerate(ceilings):
        draws = [run[attempt] for run in runs]
        assert all(0.0 <= d <= ceiling for d in draws)
        assert max(draws) > 0.8 * ceiling and min(draws) < 0.2 * ceiling  # full jitter: the whole range is used
    for _ in range(40):
        assert backoff.next_delay() <= 8.0
    backoff.reset()
    assert backoff.next_delay() <= 0.5
