"""Reed-Solomon decoding of Shamir shares with wrong ones among them (Berlekamp-Welch), over GF(p), p = 2^31 - 1.

Shamir shares of a secret are a Reed-Solomon codeword: n points on a polynomial f of degree t - 1. Up to
e = floor((n - t) / 2) wrong points are corrected: with an error locator E (monic, degree e, zero where the points
are wrong) and Q = f E (degree e + t - 1), every point satisfies Q(x_i) = y_i E(x_i), n linear equations in the
2e + t unknown coefficients; any solution gives f = Q / E (Q - f E vanishes at the n - e right points, more than
its degree). Unlike a search over t-subsets, it finds f whatever the wrong points and however colluding liars chose
their errors, in one elimination per chunk (a few milliseconds at 30 holders).
"""

from __future__ import annotations

import numpy as np

from protocol.secagg.shamir import P

_P = np.uint64(P)


def correct(xs: np.ndarray, ys: np.ndarray, threshold: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(f(0) per chunk as (chunks,) uint64, a (n,) bool of the points off f in any chunk) from n points ``xs`` (n,)
    with values ``ys`` (n, chunks), each chunk its own polynomial of degree < ``threshold``; None when more than
    floor((n - threshold) / 2) points are wrong in some chunk (no polynomial fits that many)."""
    xs = np.asarray(xs, dtype=np.uint64) % _P
    ys = np.asarray(ys, dtype=np.uint64) % _P
    n, t = xs.size, threshold
    if n < t:
        return None
    e = (n - t) // 2
    powers = np.ones((n, e + t), dtype=np.uint64)  # x_i^j, j < e + t
    for j in range(1, e + t):
        powers[:, j] = powers[:, j - 1] * xs % _P
    secrets = np.zeros(ys.shape[1], dtype=np.uint64)
    wrong = np.zeros(n, dtype=bool)
    for chunk in range(ys.shape[1]):
        f = _decode_chunk(xs, ys[:, chunk], powers, t, e)
        if f is None:
            return None
        secrets[chunk] = f[0]
        wrong |= _evaluate(f, xs) != ys[:, chunk]
    if n - int(wrong.sum()) < t + int(wrong.sum()):  # beyond the decoding radius: f is not certain
        return None
    return secrets, wrong


def _decode_chunk(xs: np.ndarray, y: np.ndarray, powers: np.ndarray, t: int, e: int) -> list[int] | None:
    """f's coefficients (lowest first) for one chunk, or None."""
    # Unknowns: q_0 .. q_{e+t-1}, then E's e_0 .. e_{e-1} (E monic): sum_j q_j x^j - y sum_k e_k x^k = y x^e.
    a = np.concatenate([powers, (_P - y[:, None]) * powers[:, :e] % _P], axis=1)
    b = y * _power(xs, e) % _P
    solution = _solve(a, b)
    if solution is None:
        return None
    q = [int(v) for v in solution[: e + t]]
    locator = [int(v) for v in solution[e + t:]] + [1]
    f, remainder = _divide(q, locator)
    if any(remainder) or len(f) > t and any(f[t:]):
        return None
    return (f + [0] * t)[:t]


def _power(x: np.ndarray, k: int) -> np.ndarray:
    out = np.ones_like(x)
    for _ in range(k):
        out = out * x % _P
    return out


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """A solution x of a x = b over GF(p) (free unknowns 0), or None when there is none."""
    m, k = a.shape
    rows = np.concatenate([a, b[:, None]], axis=1) % _P
    pivots: list[int] = []
    r = 0
    for col in range(k):
        if r == m:
            break
        nonzero = np.flatnonzero(rows[r:, col])
        if nonzero.size == 0:
            continue
        pick = r + int(nonzero[0])
        rows[[r, pick]] = rows[[pick, r]]
        rows[r] = rows[r] * np.uint64(pow(int(rows[r, col]), P - 2, P)) % _P
        factors = rows[:, col].copy()
        factors[r] = 0
        rows = (rows + (_P - factors[:, None]) * rows[r][None, :] % _P) % _P
        pivots.append(col)
        r += 1
    if np.any(rows[r:, k]):
        return None
    x = np.zeros(k, dtype=np.uint64)
    for i, col in enumerate(pivots):
        x[col] = rows[i, k]
    return x


def _divide(numerator: list[int], divisor: list[int]) -> tuple[list[int], list[int]]:
    """(quotient, remainder) of polynomials over GF(p), coefficients lowest first; ``divisor`` monic."""
    remainder = numerator[:]
    degree = len(divisor) - 1
    quotient = [0] * max(len(numerator) - degree, 1)
    for shift in range(len(numerator) - degree - 1, -1, -1):
        coefficient = remainder[shift + degree]
        quotient[shift] = coefficient
        if coefficient:
            for i, d in enumerate(divisor):
                remainder[shift + i] = (remainder[shift + i] - coefficient * d) % P
    return quotient, remainder[:degree]


def _evaluate(coefficients: list[int], xs: np.ndarray) -> np.ndarray:
    acc = np.zeros_like(xs)
    for c in reversed(coefficients):
        acc = (acc * xs + np.uint64(c)) % _P
    return acc
