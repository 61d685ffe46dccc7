"""Round policies: when a round opens and closes, whom it selects, and which updates it admits.

The engine owns round state and I/O; a policy only reads it (through an ``AdmissionView``) and
decides. One file per policy, each registering itself in ``POLICIES`` under the ``mode`` setting's
value: ``sync`` (rounds with a deadline and a quorum), ``async`` (FedBuff); ``secagg`` (synchronous rounds
securely aggregated) is chosen by the ``secure_aggregation`` setting. Settings are typed only
for the checker here: this package is imported while ``coordinator.settings`` reads the names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator.policies.base import RoundPolicy
from coordinator.policies.fedbuff import FedBuffPolicy
from coordinator.policies.registry import POLICIES
from coordinator.policies.secure import SecurePolicy
from coordinator.policies.synchronous import SynchronousPolicy

if TYPE_CHECKING:
    from coordinator.settings import CoordinatorSettings


def build_policy(settings: CoordinatorSettings) -> RoundPolicy:
    """The ``mode``'s policy; with ``secure_aggregation`` on, ``secagg`` (synchronous rounds, masked answers)."""
    return POLICIES.get("secagg" if settings.secure_aggregation else settings.mode)(settings)


__all__ = ["POLICIES", "FedBuffPolicy", "RoundPolicy", "SecurePolicy", "SynchronousPolicy", "build_policy"]
