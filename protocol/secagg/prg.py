"""Expand a 32-byte seed into ring elements (uint32, the integers modulo 2^32) with a stream cipher.

The keystream of ChaCha20 (or AES-256-CTR) over zeros, read as little-endian uint32: every bit of
the seed counts, unlike a generator seeded with 32 bits. Each seed is used for one stream only
(fresh keys per round), so a fixed nonce is safe. ChaCha20 is the default because edge CPUs without
AES instructions (Raspberry Pi 4) run it several times faster than AES; with AES-NI (x86 servers)
AES-256-CTR is the faster one (about twice ChaCha20's speed on this project's x86 machine), so the
round announces which (the coordinator's ``secagg_prg``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

PrgName = Literal["chacha20", "aes-ctr"]
"""As a round's announcement names them (``SecureSetup.prg``); aes-ctr is AES-256 in counter mode."""
PRGS: tuple[PrgName, ...] = ("chacha20", "aes-ctr")
_NONCE = bytes(16)
_zeros = bytes(0)


def _cipher(seed: bytes, prg: PrgName) -> Cipher:
    if len(seed) != 32:
        raise ValueError(f"a seed has 32 bytes, not {len(seed)}")
    if prg == "chacha20":
        return Cipher(algorithms.ChaCha20(seed, _NONCE), mode=None)
    if prg == "aes-ctr":
        return Cipher(algorithms.AES(seed), modes.CTR(_NONCE))
    raise ValueError(f"unknown PRG {prg!r}; known: {', '.join(PRGS)}")


def expand(seed: bytes, n: int, prg: PrgName = "chacha20") -> np.ndarray:
    """``n`` pseudo-random uint32 from ``seed`` (a read-only array)."""
    global _zeros
    if len(_zeros) < 4 * n:
        _zeros = bytes(4 * n)  # one zero buffer reused across calls: no page faults per mask
    encryptor = _cipher(seed, prg).encryptor()
    out = bytearray(4 * n + 15)  # update_into wants room for a block beyond the input
    written = encryptor.update_into(memoryview(_zeros)[: 4 * n], out)
    return np.frombuffer(out, dtype="<u4", count=written // 4)


def add_mask(acc: np.ndarray, seed: bytes, sign: int, prg: PrgName = "chacha20") -> None:
    """``acc += sign * expand(seed)`` in the ring (uint32 arithmetic wraps modulo 2^32)."""
    mask = expand(seed, acc.size, prg)
    if sign > 0:
        np.add(acc, mask, out=acc)
    else:
        np.subtract(acc, mask, out=acc)
