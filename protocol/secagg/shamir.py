"""Shamir secret sharing of 32-byte secrets over GF(p), p = 2^31 - 1, vectorised with numpy.

A secret is cut into 11 chunks of 3 bytes (each below p); every chunk gets its own random polynomial
of degree t - 1 with the chunk as constant term, so any t - 1 shares say nothing about it. p < 2^31
keeps every product of two field elements below 2^62: plain uint64 arithmetic, no Python integers,
and many secrets are shared or recovered in one call. A share is 11 uint32 (44 bytes); the holder's
x coordinate is public (its roster position + 1).
"""

from __future__ import annotations

import os

import numpy as np

P = (1 << 31) - 1
SECRET_BYTES = 32
CHUNK_BYTES = 3
CHUNKS = -(-SECRET_BYTES // CHUNK_BYTES)  # 11
SHARE_BYTES = 4 * CHUNKS


def _uniform(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform field elements from the OS's CSPRNG (31 bits each; the one value equal to p is redrawn)."""
    count = int(np.prod(shape))
    values = np.frombuffer(os.urandom(4 * count), dtype="<u4").astype(np.uint64) & np.uint64(P)
    while (bad := np.flatnonzero(values == P)).size:
        values[bad] = np.frombuffer(os.urandom(4 * bad.size), dtype="<u4").astype(np.uint64) & np.uint64(P)
    return values.reshape(shape)


def _encode(secrets: np.ndarray) -> np.ndarray:
    """(S, 32) uint8 -> (S, 11) field elements, 3 little-endian bytes each."""
    padded = np.zeros((secrets.shape[0], CHUNKS * CHUNK_BYTES), dtype=np.uint64)
    padded[:, :SECRET_BYTES] = secrets
    chunks = padded.reshape(secrets.shape[0], CHUNKS, CHUNK_BYTES)
    return chunks[:, :, 0] | (chunks[:, :, 1] << np.uint64(8)) | (chunks[:, :, 2] << np.uint64(16))


def decode_secrets(values: np.ndarray) -> list[bytes | None]:
    """(S, 11) field elements -> each row's 32-byte secret, or None for a row no secret encodes to (bad shares)."""
    valid = ~np.any(values >> np.uint64(8 * CHUNK_BYTES), axis=1)
    valid &= (values[:, -1] >> np.uint64(8 * (SECRET_BYTES % CHUNK_BYTES))) == 0
    out = np.stack([(values >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(CHUNK_BYTES)], axis=2)
    rows = out.reshape(values.shape[0], -1)[:, :SECRET_BYTES].astype(np.uint8)
    return [row.tobytes() if ok else None for row, ok in zip(rows, valid, strict=True)]


def split(secrets: list[bytes], xs: np.ndarray, threshold: int) -> np.ndarray:
    """Shares of each secret for holders at ``xs`` (distinct, in 1..p-1): (S, len(xs), 11) uint32.

    Any ``threshold`` of one secret's shares recover it; fewer reveal nothing about it.
    """
    xs = np.asarray(xs, dtype=np.uint64)
    if not 1 <= threshold <= xs.size:
        raise ValueError(f"threshold {threshold} needs 1..{xs.size} (the number of holders)")
    if np.any(xs == 0) or np.any(xs >= P) or np.unique(xs).size != xs.size:
        raise ValueError("holders' x coordinates must be distinct and in 1..p-1")
    if any(len(s) != SECRET_BYTES for s in secrets):
        raise ValueError(f"each secret has {SECRET_BYTES} bytes")
    raw = np.frombuffer(b"".join(secrets), dtype=np.uint8).reshape(len(secrets), SECRET_BYTES)
    coefficients = _uniform((len(secrets), threshold - 1, CHUNKS))  # degree 1 .. t-1
    constant = _encode(raw)
    # Horner at every x at once: acc = acc * x + c, highest degree first.
    acc = np.zeros((len(secrets), xs.size, CHUNKS), dtype=np.uint64)
    x = xs[None, :, None]
    for degree in range(threshold - 2, -1, -1):
        acc = (acc * x + coefficients[:, None, degree, :]) % np.uint64(P)
    acc = (acc * x + constant[:, None, :]) % np.uint64(P)
    return acc.astype(np.uint32)


def _mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b) % np.uint64(P)


def _inverse(a: np.ndarray) -> np.ndarray:
    """a^(p-2) mod p (Fermat), square-and-multiply over every element at once."""
    result = np.ones_like(a)
    base = a.copy()
    exponent = P - 2
    while exponent:
        if exponent & 1:
            result = _mulmod(result, base)
        base = _mulmod(base, base)
        exponent >>= 1
    return result


def lagrange_at_zero(xs: np.ndarray) -> np.ndarray:
    """(S, t) x coordinates -> (S, t) coefficients l_j with f(0) = sum_j l_j f(x_j) mod p."""
    xs = np.asarray(xs, dtype=np.uint64) % np.uint64(P)
    t = xs.shape[1]
    numerator = np.ones_like(xs)
    denominator = np.ones_like(xs)
    for m in range(t):
        others = np.arange(t) != m
        # l_j = prod_{m != j} x_m / (x_m - x_j)
        numerator[:, others] = _mulmod(numerator[:, others], xs[:, m : m + 1])
        difference = (xs[:, m : m + 1] + np.uint64(P) - xs[:, others]) % np.uint64(P)
        denominator[:, others] = _mulmod(denominator[:, others], difference)
    if np.any(denominator == 0):
        raise ValueError("two shares of one secret come from the same holder")
    return _mulmod(numerator, _inverse(denominator))


def open_each(xs: np.ndarray, shares: np.ndarray) -> list[bytes | None]:
    """S secrets from ``threshold`` shares each: ``xs`` (S, t) holders, ``shares`` (S, t, 11); None for a row whose
    shares do not open to a 32-byte secret. A wrong share may also open to another secret (and too few shares
    always may), so callers check each result against a commitment (``protocol.secagg.recovery``)."""
    xs = np.asarray(xs, dtype=np.uint64)
    shares = np.asarray(shares, dtype=np.uint64)
    if xs.ndim != 2 or shares.shape != (*xs.shape, CHUNKS):
        raise ValueError(f"xs (S, t) and shares (S, t, {CHUNKS}) do not match: {xs.shape}, {shares.shape}")
    if np.any(shares >= P):
        raise ValueError("a share holds a value outside the field")
    coefficients = lagrange_at_zero(xs)
    total = np.zeros((xs.shape[0], CHUNKS), dtype=np.uint64)
    for j in range(xs.shape[1]):
        total = (total + _mulmod(coefficients[:, j : j + 1], shares[:, j, :])) % np.uint64(P)
    return decode_secrets(total)


def combine(xs: np.ndarray, shares: np.ndarray) -> list[bytes]:
    """``open_each``, raising ValueError when any row's shares do not open to a secret."""
    secrets = open_each(xs, shares)
    if any(secret is None for secret in secrets):
        raise ValueError("the shares do not open to a secret (a wrong or corrupted share)")
    return [secret for secret in secrets if secret is not None]
