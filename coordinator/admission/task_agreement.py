"""Coordinator and agents agree on the task: its name and version, and each family's model layout.

The coordinator imports no task code: it knows the task by its card, and a family's layout by
fingerprint. A family's layout is pinned from the card where the card declares it (built-in
tasks' cards and ``edge-agent tasks --card`` declare every family's), else from its global state,
else by a strict majority of the agents of that family once a round's quorum is online (never by
the first hello; a tie waits), and then stays for the run (it is part of the checkpoint). Agents
of another task or layout are not selected, and their updates are never aggregated (``task_mismatch``).

What is agreed is published as the run's card (``TaskAnnouncement``): ``revision`` moves whenever
a family's layout is pinned or its arrays become known, so the engine republishes it then.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from coordinator.admission.decisions import Reject
from coordinator.reasons import RejectReason
from protocol.arrays import layout_of
from protocol.messages import AgentStatus, RoundAnnouncement, Update
from protocol.tasks import FamilyLayout, TaskCard, layout_fingerprint

log = logging.getLogger(__name__)

MAX_FAMILIES = 64
"""The most families a run pins: a round announces each selected family's layout and state (at most 64 each)."""


def fingerprint_of(arrays: Mapping[str, np.ndarray]) -> str:
    """The layout fingerprint of ``arrays``; asked for every update, so remembered per layout."""
    return _fingerprint(tuple((name, array.shape, array.dtype.str) for name, array in arrays.items()))


@functools.lru_cache(maxsize=64)
def _fingerprint(layout: tuple[tuple[str, tuple[int, ...], str], ...]) -> str:
    return layout_fingerprint({name: (shape, dtype) for name, shape, dtype in layout})


class TaskAgreement:
    def __init__(self, card: TaskCard) -> None:
        self.card = card
        self._ref = card.ref  # built once: read for every status of every scan
        self.layouts: dict[str, str] = {}
        """Pinned layout fingerprint per family."""
        self.described: dict[str, FamilyLayout] = dict(card.layouts)
        """The families whose arrays are known (from the card, or from a global state's weights)."""
        self.revision = 0
        """Moves whenever ``published_card`` would change."""
        for family, layout in card.layouts.items():
            self._pinned(family, layout.fingerprint, "the task card")

    def published_card(self) -> TaskCard:
        """The card as agents should see it: every pinned family's layout, with its arrays where known."""
        layouts = {family: self.described.get(family) or FamilyLayout(fingerprint=fingerprint)
                   for family, fingerprint in sorted(self.layouts.items()) if family in self.card.families}
        return self.card.model_copy(update={"layouts": layouts})

    def status_problem(self, status: AgentStatus) -> str | None:
        """Why an agent with this status cannot take part, or None."""
        if status.task_ref != self._ref:
            return f"runs task {status.task_ref}, this run trains {self._ref}"
        pinned = self.layouts.get(status.family)
        if pinned is not None and status.layout != pinned:
            return f"its {status.family} model has layout {status.layout}, the run's is {pinned}"
        if status.problem is not None:
            return f"it refuses rounds: {status.problem}"
        return None

    def pin(self, statuses: Iterable[AgentStatus], state_weights: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Pin the layout of every family that has a global state with weights, or whose agents (of the run's
        task) agree on one by a strict majority. A tie pins nothing: one hello must not decide for the rest,
        so the family waits for more agents. The caller calls this once a round's quorum is online."""
        for family, weights in state_weights.items():
            if not weights:
                continue
            if family not in self.layouts:
                self._pinned(family, fingerprint_of(weights), "its global state")
            if family not in self.described and self.layouts[family] == fingerprint_of(weights):
                self.described[family] = FamilyLayout.of(layout_of(weights))
                self.revision += 1
        votes: dict[str, Counter[str]] = {}
        for status in statuses:
            if status.task_ref == self._ref:
                votes.setdefault(status.family, Counter())[status.layout] += 1
        for family, counter in sorted(votes.items(), key=lambda item: (item[0] not in self.card.families, item[0])):
            if family not in self.layouts and not self._room_for(family):
                log.info("task %s: family %s is not on the card and the run has room for no more families",
                         self.card.ref, family)
            elif family not in self.layouts:
                layout, count = counter.most_common(1)[0]
                if 2 * count > sum(counter.values()):
                    self._pinned(family, layout, f"{count} of {sum(counter.values())} agents")
                else:
                    log.info("task %s: family %s has no layout most of its %d agents agree on yet", self.card.ref,
                             family, sum(counter.values()))

    def _room_for(self, family: str) -> bool:
        """Whether ``family`` may be pinned: a round announces at most ``MAX_FAMILIES``, and the card's own families
        always keep their place (agents naming made-up families must not crowd them out, nor overflow a round)."""
        if family in self.card.families:
            return True
        unpinned_card = sum(f not in self.layouts for f in self.card.families)
        return len(self.layouts) + unpinned_card < MAX_FAMILIES

    def _pinned(self, family: str, layout: str, source: str) -> None:
        self.layouts[family] = layout
        self.revision += 1
        log.info("task %s: family %s has layout %s (from %s)", self.card.ref, family, layout, source)

    def check_update(self, update: Update, announcement: RoundAnnouncement) -> Reject | None:
        """``task_mismatch`` for an update of another task, or whose payload has another layout."""
        if update.task_ref != announcement.task_ref:
            return Reject(RejectReason.TASK_MISMATCH, f"task {update.task_ref}, the round's is "
                                                             f"{announcement.task_ref}")
        announced = announcement.layouts.get(update.family)
        if announced is None:
            return Reject(RejectReason.TASK_MISMATCH, f"round {announcement.round} announced no layout for "
                                                             f"family {update.family}")
        arrays = update.weights or update.delta
        if arrays and fingerprint_of(arrays) != announced:
            return Reject(RejectReason.TASK_MISMATCH, f"{'weights' if update.weights else 'delta'} of layout "
                                                             f"{fingerprint_of(arrays)}, announced {announced}")
        if update.prototypes is not None:
            expected = (self.card.num_classes, self.card.embedding_dim)
            if update.prototypes.shape != expected:
                return Reject(RejectReason.TASK_MISMATCH, f"prototypes are {list(update.prototypes.shape)}, "
                                                                 f"task {self.card.ref} has {list(expected)}")
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.card.name, "version": self.card.version, "layouts": dict(self.layouts)}

    def load_state_dict(self, saved: Mapping[str, Any], where: str) -> None:
        """Resume the pinned layouts; ValueError if the checkpoint is another task's run."""
        if (saved.get("name"), saved.get("version")) != (self.card.name, self.card.version):
            raise ValueError(f"checkpoint in {where} is a run of task {saved.get('name')}@{saved.get('version')}, "
                             f"not {self.card.ref}; use another state_dir to start a new run")
        layouts = saved.get("layouts")
        if not isinstance(layouts, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and len(v) == 32 for k, v in layouts.items()):
            raise ValueError(f"checkpoint in {where}: task layouts must map family names to fingerprints")
        for family, declared in self.card.layouts.items():
            if layouts.get(family, declared.fingerprint) != declared.fingerprint:
                raise ValueError(f"checkpoint in {where}: family {family} was trained with layout {layouts[family]}, "
                                 f"the task card declares {declared.fingerprint}; use another state_dir to start a "
                                 f"new run with this card")
        self.layouts = {**layouts, **{f: d.fingerprint for f, d in self.card.layouts.items()}}
        self.revision += 1
