"""Rebuilding each agent's secret from the shares its neighbours revealed, when some of them lie.

A survivor that reveals a wrong share must not fail the round: the server holds more shares than the
threshold t in most rounds (every surviving neighbour answers), and each secret has a public check (the
self-mask seed its advertised commitment, the mask key its advertised public key). So the secret is the
first t-subset of the shares, in holder order, whose opening passes the check; the first t shares open it
in an honest round (one batched interpolation for every agent), and a lie costs a search over further
subsets. A share is then named a misfit when, with t - 1 shares of the opening subset, it opens to another
secret: it is off the dealer's polynomial, so its holder revealed a wrong share, or the dealer sealed a
wrong one to it (the server cannot tell which; either way the agent is named in the round's record).

The search is bounded (``MAX_TRIES`` subsets an agent): an agent with more wrong shares than that finds
fails the round, with a reason naming it, as a dealer whose every share is wrong does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import combinations, islice

import numpy as np

from protocol.secagg import shamir
from protocol.secagg.errors import SecAggAborted

MAX_TRIES = 512
_BATCH = 64

Share = tuple[int, str, np.ndarray]
"""(x coordinate, holder, share): one revealed share of an agent's secret."""


@dataclass
class Recovered:
    secrets: dict[str, bytes] = field(default_factory=dict)  # agent -> its checked secret
    misfits: dict[str, set[str]] = field(default_factory=dict)  # holder -> agents whose share it revealed off-curve


def subsets(n: int, t: int, limit: int) -> Iterator[tuple[int, ...]]:
    """t-subsets of range(n), ordered by their largest index (the first shares first), at most ``limit``."""
    every = ((*rest, top) for top in range(t - 1, n) for rest in combinations(range(top), t - 1))
    return islice(every, limit)


def recover(found: dict[str, list[Share]], threshold: int, check: Callable[[str, bytes], bool],
            what: str) -> Recovered:
    """Each agent's secret from its revealed shares (``found``, agent -> shares, any order); raises SecAggAborted for
    an agent with fewer than ``threshold`` shares or none of whose subsets within MAX_TRIES passes ``check``."""
    t = threshold
    ordered = {agent: sorted(shares, key=lambda share: share[0]) for agent, shares in found.items()}
    for agent, shares in ordered.items():
        if len(shares) < t:
            raise SecAggAborted("unmask", f"{len(shares)} shares of {agent!r}'s {what} arrived, "
                                          f"fewer than the threshold {t}")
    result = Recovered()
    if not ordered:
        return result
    agents = list(ordered)
    first = _open([(ordered[a], tuple(range(t))) for a in agents])  # the honest round: one batch
    opening: dict[str, tuple[int, ...]] = {}
    for agent, secret in zip(agents, first, strict=True):
        if secret is not None and check(agent, secret):
            result.secrets[agent], opening[agent] = secret, tuple(range(t))
        else:
            secret, subset = _search(ordered[agent], t, lambda s, a=agent: check(a, s))
            if secret is None:
                raise SecAggAborted("unmask", f"no {t} of the {len(ordered[agent])} shares of {agent!r}'s {what} "
                                              f"open to the {what} it committed to (within {MAX_TRIES} tries)")
            result.secrets[agent], opening[agent] = secret, subset
    _name_misfits(ordered, opening, result)
    return result


def _open(rows: list[tuple[list[Share], tuple[int, ...]]]) -> list[bytes | None]:
    """The secret each (shares, subset) opens to, all in one interpolation."""
    xs = np.array([[shares[i][0] for i in subset] for shares, subset in rows], dtype=np.uint64)
    ys = np.array([[shares[i][2] for i in subset] for shares, subset in rows], dtype=np.uint64)
    return shamir.open_each(xs, ys)


def _search(shares: list[Share], t: int, check: Callable[[bytes], bool]) -> tuple[bytes | None, tuple[int, ...]]:
    candidates = subsets(len(shares), t, MAX_TRIES)
    while batch := list(islice(candidates, _BATCH)):
        for subset, secret in zip(batch, _open([(shares, s) for s in batch]), strict=True):
            if secret is not None and check(secret):
                return secret, subset
    return None, ()


def _name_misfits(ordered: dict[str, list[Share]], opening: dict[str, tuple[int, ...]], result: Recovered) -> None:
    """With t - 1 shares of an agent's opening subset, each other share opens to the agent's secret iff it is on the
    dealer's polynomial (a wrong one shifts the constant term by a non-zero multiple of its error). The opening
    subset's own shares are on it: together they opened the checked secret."""
    rows: list[tuple[list[Share], tuple[int, ...]]] = []
    owners: list[tuple[str, str]] = []
    for agent, subset in opening.items():
        base = subset[1:]
        for j in sorted(set(range(len(ordered[agent]))) - set(subset)):
            rows.append((ordered[agent], (*base, j)))
            owners.append((agent, ordered[agent][j][1]))
    if not rows:
        return
    for (agent, holder), secret in zip(owners, _open(rows), strict=True):
        if secret != result.secrets[agent]:
            result.misfits.setdefault(holder, set()).add(agent)
