"""Round policies: when a round opens and closes, whom it selects, and which updates it admits.

The engine owns round state and I/O; a policy only reads it (through an ``AdmissionView``) and
decides. ``synchronous``: rounds with a deadline and a quorum. ``fedbuff``: buffered
asynchronous aggregation, a new global version every ``buffer_size`` updates.
"""

from __future__ import annotations

from coordinator.policies.base import Admission, AdmissionView, Defer, RoundPolicy
from coordinator.policies.fedbuff import FedBuffPolicy
from coordinator.policies.synchronous import SynchronousPolicy
from coordinator.settings import CoordinatorSettings


def build_policy(settings: CoordinatorSettings) -> RoundPolicy:
    if settings.mode == "async":
        return FedBuffPolicy(settings.buffer_size, settings.max_staleness, settings.staleness_exponent)
    return SynchronousPolicy()


__all__ = ["Admission", "AdmissionView", "Defer", "FedBuffPolicy", "RoundPolicy", "SynchronousPolicy",
           "build_policy"]
