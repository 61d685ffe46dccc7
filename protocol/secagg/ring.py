"""The ring a masked input lives in, Z_{2^b} with b <= 32, and its wire form: b bits an element.

Masks are drawn in Z_2^32 (``prg``), and everything the client and the server compute stays there.
Reduction modulo 2^b is a ring homomorphism from Z_2^32 onto Z_2^b (2^b divides 2^32), so an agent
may send only the low b bits of its masked input: the server sums those, removes the masks in Z_2^32
as before, and reads the low b bits of the result, which are the sum of the inputs modulo 2^b. A
mask reduced modulo 2^b is still uniform on Z_2^b (the keystream is uniform on 32 bits), so the b
bits sent hide the input as the 32 did.

The sum is exact when it cannot wrap: every one of ``n`` summands lies in [-L, L] (the grid's
``levels``), so the sum lies in [-nL, nL], which needs nL <= 2^(b-1) - 1 (``ring_bits``). Grids:

* ``fine`` (compression none): b = 32, L = (2^31 - 1) // n, the finest step the ring allows.
* ``int8``: L = 127, the grid of an int8 entry at the declared clip (step clip / 127, stochastic
  rounding, unbiased). b = bit_length(127 n) + 1: 12 bits for 10 agents, 15 for 100, 17 for 500.
  Unlike plain int8, whose scale is each tensor's largest value, the scale is the declared clip:
  every agent must use the same grid for the integer sum to mean anything.
* ``fp16``: L = 2047, the 11-bit significand of a half-precision float at full scale (a float
  format cannot be summed in a ring: this is fixed point with fp16's resolution near the clip,
  coarser than fp16 for small values). b = 16 bits for 10 agents, 19 for 100.

Top-k is refused: each agent keeps a different set of coordinates, and a sparse masked vector would
show which (the positions are the information); masking the agreed union sends the dense vector.
"""

from __future__ import annotations

import numpy as np

RING_BITS = 32
UNPACK_BLOCK = 1 << 18
"""Elements ``pack`` and ``unpack`` handle per pass (their temporaries: a few MB whatever the input's size); a
multiple of 32, so that a block of ``pack`` starts on a word boundary."""
GRID_LEVELS: dict[str, int] = {"int8": 127, "fp16": 2047}
"""Compression kind -> the largest |integer| one value quantises to; absent: the ring's finest grid."""


def ring_bits(levels: int, summands: int) -> int:
    """The fewest bits b such that ``summands`` values in [-levels, levels] sum without wrapping in Z_2^b."""
    if levels < 1 or summands < 1:
        raise ValueError("levels and summands must be at least 1")
    return (levels * summands).bit_length() + 1


def words(count: int, bits: int) -> int:
    """uint32 words that carry ``count`` elements of ``bits`` bits."""
    return -(-count * bits // 32)


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of each uint32 of ``values``, back to back (little-endian), in uint32 words."""
    values = np.ascontiguousarray(values, dtype="<u4")
    if bits == RING_BITS:
        return values.copy()
    _check(bits)
    # Element i goes to bit i * bits of the stream: shifted into a uint64 at its word's offset, its low half
    # lands in word (i * bits) // 32 and its high half in the next. Within a word the elements' bits are
    # disjoint, so adding them is or-ing them, and float64 holds their sums (< 2^32) exactly: bincount adds
    # them per word. A block is a multiple of 32 elements, so each block starts on a word of its own.
    out = np.zeros(words(values.size, bits) + 1, dtype=np.uint32)
    low = np.uint32((1 << bits) - 1)
    for start in range(0, values.size, UNPACK_BLOCK):
        block = values[start:start + UNPACK_BLOCK]
        first = np.arange(block.size, dtype=np.uint64) * np.uint64(bits)
        index = (first >> np.uint64(5)).astype(np.intp)
        shifted = (block & low).astype(np.uint64) << (first & np.uint64(31))
        span = int(index[-1]) + 2
        summed = np.bincount(index, (shifted & np.uint64(0xFFFFFFFF)).astype(np.float64), minlength=span)
        summed += np.bincount(index + 1, (shifted >> np.uint64(32)).astype(np.float64), minlength=span)
        base = start * bits // 32
        out[base:base + span] |= summed.astype(np.uint32)
    return out[:-1].view("<u4")


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``count`` uint32 elements (each < 2^bits) from ``pack``'s words; ValueError on a wrong length."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint32 or packed.shape != (words(count, bits),):
        raise ValueError(f"a masked input of {count} elements of {bits} bits is uint32[{words(count, bits)}], "
                         f"not {packed.dtype}{list(packed.shape)}")
    if bits == RING_BITS:
        return packed.astype(np.uint32, copy=True)
    _check(bits)
    # Element i starts at bit i * bits of the little-endian stream: in word (i * bits) // 32 and perhaps the next.
    # Read two words at a time as one uint64 and shift, a block of elements at a time: a few times the input's
    # size at most, where expanding every bit to a byte took 35 times it.
    words64 = np.zeros(packed.size + 1, dtype=np.uint64)
    words64[:-1] = np.ascontiguousarray(packed, dtype="<u4")
    out = np.empty(count, dtype=np.uint32)
    mask = np.uint64((1 << bits) - 1)
    for start in range(0, count, UNPACK_BLOCK):
        first = np.arange(start, min(start + UNPACK_BLOCK, count), dtype=np.uint64) * np.uint64(bits)
        index = (first >> np.uint64(5)).astype(np.intp)
        pair = words64[index] | (words64[index + 1] << np.uint64(32))
        out[start:start + first.size] = (pair >> (first & np.uint64(31))) & mask
    return out


def signed(total: np.ndarray, bits: int) -> np.ndarray:
    """Ring elements of Z_2^32 reduced modulo 2^bits and read as two's complement integers (int64)."""
    _check(bits)
    low = np.asarray(total, dtype=np.uint32).astype(np.int64) & ((1 << bits) - 1)
    return np.where(low >= 1 << (bits - 1), low - (1 << bits), low)


def _check(bits: int) -> None:
    if not 2 <= bits <= RING_BITS:
        raise ValueError(f"a ring of 2^{bits}: the ring has 2 to {RING_BITS} bits")
