"""Rebuilding each agent's secret from the shares its neighbours revealed, when some of them lie.

A survivor that reveals a wrong share must not fail the round: the server holds more shares than the threshold t
in most rounds (every surviving neighbour answers), and each secret has a public check (the self-mask seed its
advertised commitment, the mask key its advertised public key). In an honest round the first t shares, in holder
order, open a secret that passes its check and every other share lies on their polynomial: one batched
interpolation for every agent. Otherwise the shares are decoded as a Reed-Solomon codeword (``decoding.py``): the
polynomial is the one all but at most floor((n - t) / 2) of the n shares lie on, whichever shares are wrong and
however colluding liars chose their errors, and the shares off it are named misfits (their holder revealed a wrong
share, or the dealer sealed it a wrong one: the server cannot tell which). A secret with more wrong shares than
that is still opened if one of its first ``MAX_TRIES`` t-subsets opens a secret that passes the check (the
commitment makes it the right one), but no holder is named then (``unattributed``): checking the secret alone does
not tell whose share is wrong, since errors of colluding liars can cancel in one t-subset, which then opens the right
secret while honest shares look off its polynomial. One that does not open (or whose dealer dealt inconsistent
shares) fails the round, naming the agent.

Results are kept per agent (``Opened``), so a caller that tries again as responses arrive (``SecAggServer.ready``)
decodes only the agents whose shares changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import combinations, islice

import numpy as np

from protocol.secagg import shamir
from protocol.secagg.decoding import correct
from protocol.secagg.errors import SecAggAborted

MAX_TRIES = 512
"""t-subsets tried for a secret whose shares cannot be decoded (more wrong ones than the radius)."""
_BATCH = 64

Share = tuple[int, str, np.ndarray]
"""(x coordinate, holder, share): one revealed share of an agent's secret."""


@dataclass(frozen=True)
class Opened:
    shares: int  # how many shares it was opened from
    secret: bytes | None  # None: they do not open to a secret that passes its check
    misfits: frozenset[str] = frozenset()  # holders whose share is off the polynomial
    unattributed: bool = False  # opened past the decoding radius: some shares were wrong, whose is not certain


@dataclass
class Recovered:
    secrets: dict[str, bytes] = field(default_factory=dict)  # agent -> its checked secret
    misfits: dict[str, set[str]] = field(default_factory=dict)  # holder -> agents whose share it revealed off-curve
    unattributed: set[str] = field(default_factory=set)  # agents opened with wrong shares among theirs, unnamed


def recover(found: dict[str, list[Share]], threshold: int, check: Callable[[str, bytes], bool], what: str,
            cache: dict[str, Opened] | None = None) -> Recovered:
    """Each agent's secret from its revealed shares (``found``, agent -> shares, any order); raises SecAggAborted
    for an agent with fewer than ``threshold`` shares or whose shares do not open to a secret that passes ``check``.
    ``cache`` keeps each agent's result across calls (reused while its share count is unchanged)."""
    t, cache = threshold, cache if cache is not None else {}
    ordered = {agent: sorted(shares, key=lambda share: share[0]) for agent, shares in found.items()}
    for agent, shares in ordered.items():
        if len(shares) < t:
            raise SecAggAborted("unmask", f"{len(shares)} shares of {agent!r}'s {what} arrived, "
                                          f"fewer than the threshold {t}")
    stale = [a for a in ordered if a not in cache or cache[a].shares != len(ordered[a])]
    known = {agent: cache[agent].secret for agent in stale if agent in cache}
    for agent, opened in _open_honest(ordered, stale, t, check).items():
        cache[agent] = opened
    for agent in stale:
        if cache[agent].secret is None:
            cache[agent] = _decode(ordered[agent], t, lambda s, a=agent: check(a, s), known.get(agent))
    result = Recovered()
    for agent, shares in ordered.items():
        opened = cache[agent]
        if opened.secret is None:
            raise SecAggAborted("unmask", f"the {len(shares)} shares of {agent!r}'s {what} do not open to the {what} "
                                          f"it committed to (decoded, and {MAX_TRIES} subsets tried): too many of "
                                          f"them are wrong, or it dealt them wrong")
        result.secrets[agent] = opened.secret
        if opened.unattributed:
            result.unattributed.add(agent)
        for holder in opened.misfits:
            result.misfits.setdefault(holder, set()).add(agent)
    return result


def _open_honest(ordered: dict[str, list[Share]], agents: list[str], t: int,
                 check: Callable[[str, bytes], bool]) -> dict[str, Opened]:
    """The agents whose first t shares open a checked secret that every other share agrees with (an honest round:
    two batched interpolations in all); the others as not opened yet."""
    if not agents:
        return {}
    first = _open([(ordered[a], tuple(range(t))) for a in agents])
    rows: list[tuple[list[Share], tuple[int, ...]]] = []
    owners: list[str] = []
    for agent in agents:  # with the first t - 1 shares, each later one opens the same secret iff it is on f
        rows += [(ordered[agent], (*range(1, t), j)) for j in range(t, len(ordered[agent]))]
        owners += [agent] * (len(ordered[agent]) - t)
    opened_first = dict(zip(agents, first, strict=True))
    disagree = {agent for agent, secret in zip(owners, _open(rows) if rows else [], strict=True)
                if secret != opened_first[agent]}
    return {agent: Opened(len(ordered[agent]), secret if secret is not None and agent not in disagree
                          and check(agent, secret) else None)
            for agent, secret in zip(agents, first, strict=True)}


def _decode(shares: list[Share], t: int, check: Callable[[bytes], bool], known: bytes | None = None) -> Opened:
    """Reed-Solomon decoding; past its radius, a search for a t-subset that opens a checked secret (the commitment
    makes that secret the right one, but then no holder is named: which shares are wrong is not certain). ``known``:
    the secret an earlier call opened from fewer of these shares (more shares do not change it: no search again)."""
    xs = np.array([x for x, _, _ in shares], dtype=np.uint64)
    ys = np.array([share for _, _, share in shares], dtype=np.uint64)
    decoded = correct(xs, ys, t)
    if decoded is not None:
        values, wrong = decoded
        secret = shamir.decode_secrets(values[None, :])[0]
        if secret is not None and check(secret):
            return Opened(len(shares), secret, frozenset(
                holder for (_, holder, _), off in zip(shares, wrong, strict=True) if off))
    if known is not None:
        return Opened(len(shares), known, unattributed=True)
    candidates = subsets(len(shares), t, MAX_TRIES)
    while batch := list(islice(candidates, _BATCH)):
        for secret in _open([(shares, subset) for subset in batch]):
            if secret is not None and check(secret):
                return Opened(len(shares), secret, unattributed=True)
    return Opened(len(shares), None)


def subsets(n: int, t: int, limit: int) -> Iterator[tuple[int, ...]]:
    """t-subsets of range(n), ordered by their largest index (the first shares first), at most ``limit``."""
    every = ((*rest, top) for top in range(t - 1, n) for rest in combinations(range(top), t - 1))
    return islice(every, limit)


def _open(rows: list[tuple[list[Share], tuple[int, ...]]]) -> list[bytes | None]:
    """The secret each (shares, subset) opens to, all in one interpolation."""
    xs = np.array([[shares[i][0] for i in subset] for shares, subset in rows], dtype=np.uint64)
    ys = np.array([[shares[i][2] for i in subset] for shares, subset in rows], dtype=np.uint64)
    return shamir.open_each(xs, ys)
