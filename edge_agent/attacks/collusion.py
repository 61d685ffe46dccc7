"""How "a little is enough" attackers learn what honest updates look like: they collude.

Following Baruch et al. (2019), colluding attackers each train honestly first, pool those
benign updates, and estimate the honest mean and standard deviation from them. The pool is
a rendezvous handed to every attacker by whoever runs the bench (``InProcessCollusion`` for
agents on threads of one process). FOR TESTS AND BENCHMARKS ONLY.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

PoolKey = tuple[str, int, str]
"""(run id, round, model family): only updates of one layout are pooled together."""


@dataclass(frozen=True)
class HonestEstimate:
    mean: dict[str, np.ndarray]
    std: dict[str, np.ndarray]
    members: int
    """How many benign updates the estimate is made of."""


class Collusion(Protocol):
    def pool(self, key: PoolKey, member: str, benign: Mapping[str, np.ndarray]) -> HonestEstimate:
        """Add ``member``'s benign update to the pool for ``key``; the estimate from every member's."""
        ...


class InProcessCollusion:
    """A rendezvous for ``members`` attackers running in this process.

    ``pool`` waits until every member has deposited for the key, or ``timeout_s`` passed (an
    unselected or dead colluder must not stall the rest), then estimates the element-wise
    mean and population standard deviation over the deposits (floating arrays only).
    """

    def __init__(self, members: int, timeout_s: float = 60.0, keep_rounds: int = 4) -> None:
        if members < 1:
            raise ValueError("a collusion needs at least one member")
        self.members = members
        self.timeout_s = timeout_s
        self.keep_rounds = keep_rounds
        self._cond = threading.Condition()
        self._deposits: OrderedDict[PoolKey, dict[str, dict[str, np.ndarray]]] = OrderedDict()

    def pool(self, key: PoolKey, member: str, benign: Mapping[str, np.ndarray]) -> HonestEstimate:
        with self._cond:
            deposits = self._deposits.setdefault(key, {})
            deposits[member] = {name: np.array(a, copy=True) for name, a in benign.items()}
            while len(self._deposits) > self.keep_rounds:
                self._deposits.popitem(last=False)
            self._cond.notify_all()
            deadline = time.monotonic() + self.timeout_s
            while len(deposits) < self.members and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            pooled = list(deposits.values())
        if len(pooled) < self.members:
            log.warning("collusion %s: only %d of %d colluders deposited in %.0fs", key, len(pooled), self.members,
                        self.timeout_s)
        return estimate(pooled)


def estimate(updates: list[dict[str, np.ndarray]]) -> HonestEstimate:
    mean: dict[str, np.ndarray] = {}
    std: dict[str, np.ndarray] = {}
    for name, first in updates[0].items():
        if first.dtype.kind != "f":
            continue
        stacked = np.stack([u[name].astype(np.float64) for u in updates])
        mean[name] = stacked.mean(axis=0)
        std[name] = stacked.std(axis=0)
    return HonestEstimate(mean, std, len(updates))
