"""The registry of round policies (``--mode``): each entry builds its policy from the settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocol.registry import Registry

if TYPE_CHECKING:  # a type only; the factories receive the settings object
    from coordinator.policies.base import RoundPolicy

POLICIES: Registry[Callable[[Any], RoundPolicy]] = Registry("round policy", "edgefl.round_policies")
"""Keyed by the ``mode`` setting's value."""
