"""Counting and logging what was refused: every refusal counted by reason, the first per (sender, reason) logged.

A broken device cannot flood the log: later refusals for the same reason are only counted. Nor can
a fleet-wide condition (a full registry, an old software version after an upgrade): past
``MAX_SENDERS_PER_REASON`` senders logged for one reason, one line says that further senders are
only counted, and the set of logged pairs is capped overall.
"""

from __future__ import annotations

import logging
from collections import Counter

from coordinator.telemetry.metrics import CoordinatorMetrics

log = logging.getLogger("coordinator.rejects")

MAX_LOGGED = 10_000
MAX_SENDERS_PER_REASON = 20


class RejectLog:
    def __init__(self, metrics: CoordinatorMetrics) -> None:
        self.metrics = metrics
        self._logged: set[tuple[str, str]] = set()
        self._senders: Counter[str] = Counter()
        """Senders logged per reason (topic)."""

    def record(self, kind: str, reason: str, sender: str, detail: str, action: str = "dropped") -> None:
        self.metrics.rejected.labels(kind, reason).inc()
        if self.first(sender, reason):
            log.warning("%s %s from %s: %s: %s (further ones for this reason are only counted)",
                        action, kind, sender, reason, detail)
        elif self._senders[reason] == MAX_SENDERS_PER_REASON and (sender, reason) not in self._logged:
            self._senders[reason] += 1  # said once
            log.warning("%s %s from more than %d senders for %s: further senders are only counted "
                        "(fl_messages_rejected_total{reason})", action, kind, MAX_SENDERS_PER_REASON, reason)

    def first(self, sender: str, topic: str) -> bool:
        """True the first time (sender, topic) is seen, while fewer than ``MAX_SENDERS_PER_REASON`` senders
        were logged for ``topic`` and fewer than ``MAX_LOGGED`` pairs overall: log it then."""
        if ((sender, topic) in self._logged or len(self._logged) >= MAX_LOGGED
                or self._senders[topic] >= MAX_SENDERS_PER_REASON):
            return False
        self._logged.add((sender, topic))
        self._senders[topic] += 1
        return True
