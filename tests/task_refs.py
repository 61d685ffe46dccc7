"""The task test fleets run (the built-in digits) as messages name it, and layout fingerprints.

Statuses carry the layout of the model an agent sends, and announcements the layout of each
selected family: ``layout`` gives it for the arrays a test sends, ``family_layout`` for a task's
real model. Importing this module loads no torch (the coordinator's tests run without it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache

import numpy as np

from protocol.arrays import layout_of
from protocol.messages import TaskRef
from protocol.tasks import BUILTIN_CARDS, layout_fingerprint

DIGITS: TaskRef = BUILTIN_CARDS["digits"].ref
"""``digits@1``: the task of every agent and coordinator that is given none."""


def layout(arrays: Mapping[str, np.ndarray]) -> str:
    """The fingerprint of the arrays an update carries (what the coordinator compares)."""
    return layout_fingerprint(layout_of(arrays))


@cache
def family_layout(family: str, task: str = "digits") -> str:
    """The fingerprint of ``task``'s ``family`` model, as an agent of that family reports it (loads torch)."""
    from edge_agent.tasks.checks import model_fingerprint
    from edge_agent.tasks.registry import resolve_task

    return model_fingerprint(resolve_task(task).build_model(family, seed=0))


def family_layouts(families: Iterable[str], task: str = "digits") -> dict[str, str]:
    """``RoundAnnouncement.layouts`` for rounds that select agents of ``families``."""
    return {family: family_layout(family, task) for family in sorted(set(families))}
