"""The sparse communication graph of SecAgg+ (Bell et al., CCS 2020): a Harary graph of degree k on
a random permutation of the roster, drawn from the round's public randomness.

Each agent exchanges keys, shares and pairwise masks with its k neighbours only, so its work grows
with k = O(log n) rather than with n. Everyone derives the same graph from the same seed (the
permutation comes from a ChaCha20 keystream, the same on every platform); the seed is announced with
the round, after the roster is fixed, so nobody picks their neighbours.
"""

from __future__ import annotations

import math

import numpy as np

from protocol.secagg.prg import expand


def default_degree(n: int) -> int:
    """k = 3 * ceil(log2 n), made even (a Harary graph of odd degree needs an even n), at most n - 1.

    Bell et al. give k = O(log n) with constants from the tolerated dropout and corruption rates;
    this is a fixed choice that keeps about 3 log2 n neighbours (n = 100: 22; n = 500: 28).
    """
    if n < 2:
        raise ValueError("secure aggregation needs at least two agents")
    k = 3 * math.ceil(math.log2(n))
    k += k % 2
    return min(k, n - 1)


def default_threshold(degree: int) -> int:
    """A majority of an agent's neighbours: fewer cannot recover its secrets."""
    return degree // 2 + 1


def neighbours(n: int, degree: int, seed: bytes) -> list[frozenset[int]]:
    """For each roster position 0..n-1, the positions of its ``degree`` neighbours (symmetric)."""
    if not 1 <= degree <= n - 1:
        raise ValueError(f"degree {degree} needs 1..{n - 1} for {n} agents")
    if degree == n - 1:
        return [frozenset(range(n)) - {i} for i in range(n)]
    if degree % 2:
        raise ValueError(f"degree {degree} must be even below n - 1")
    # A random permutation: sort positions by 32-bit keystream values (ties, if any, by position).
    order = np.argsort(expand(seed, n), kind="stable")
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n)
    half = degree // 2
    out: list[frozenset[int]] = []
    for i in range(n):
        here = int(place[i])
        out.append(frozenset(int(order[(here + step) % n]) for step in range(-half, half + 1) if step))
    return out
