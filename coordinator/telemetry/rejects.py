"""Counting and logging what was refused: every refusal counted by reason, the first per (sender, reason) logged.

A broken device cannot flood the log: later refusals for the same reason are only counted, and
the set of logged pairs is capped.
"""

from __future__ import annotations

import logging

from coordinator.telemetry.metrics import CoordinatorMetrics

log = logging.getLogger("coordinator.rejects")

MAX_LOGGED = 10_000


class RejectLog:
    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics
        self._logged: set[tuple[str, str]] = set()

    def record(self, kind: str, reason: str, sender: str, detail: str, action: str = "dropped") -> None:
        self.metrics.rejected.labels(kind, reason).inc()
        if self.first(sender, reason):
            log.warning("%s %s from %s: %s: %s (further ones for this reason are only counted)",
                        action, kind, sender, reason, detail)

    def first(self, sender: str, topic: str) -> bool:
        """True the first time (sender, topic) is seen, while fewer than MAX_LOGGED pairs were: log it then."""
        if (sender, topic) in self._logged or len(self._logged) >= MAX_LOGGED:
            return False
        self._logged.add((sender, topic))
        return True
