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
    # 32 elements of b bits fill exactly b words, so the stream is a sequence of groups of the same layout:
    # element j of a group starts at bit j * b, in word (j * b) // 32 of the group, and spills into the next
    # word when it crosses a word's end. Working on the groups' element j together (a column, made contiguous
    # by a transpose) costs 32 vector shifts and ors per block, whatever its size.
    out = np.empty(words(values.size, bits), dtype=np.uint32)
    low = np.uint32((1 << bits) - 1)
    size = _block()
    for start in range(0, values.size, size):
        block = values[start:start + size]
        groups = -(-block.size // 32)
        padded = np.zeros(groups * 32, dtype=np.uint32)
        np.bitwise_and(block, low, out=padded[:block.size])
        columns = np.ascontiguousarray(padded.reshape(groups, 32).T)
        grouped = np.zeros((bits, groups), dtype=np.uint32)
        moved = np.empty(groups, dtype=np.uint32)
        for j in range(32):
            word, shift = divmod(j * bits, 32)
            np.left_shift(columns[j], np.uint32(shift), out=moved)  # the bits past the word's end fall off
            grouped[word] |= moved
            if shift + bits > 32:
                np.right_shift(columns[j], np.uint32(32 - shift), out=moved)
                grouped[word + 1] |= moved
        base = start * bits // 32  # a block is whole groups: it starts on a word of its own
        stream = grouped.T.reshape(-1)
        out[base:base + min(stream.size, out.size - base)] = stream[:out.size - base]
    return out


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``count`` uint32 elements (each < 2^bits) from ``pack``'s words; ValueError on a wrong length."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint32 or packed.shape != (words(count, bits),):
        raise ValueError(f"a masked input of {count} elements of {bits} bits is uint32[{words(count, bits)}], "
                         f"not {packed.dtype}{list(packed.shape)}")
    if bits == RING_BITS:
        return packed.astype(np.uint32, copy=True)
    _check(bits)
    # pack's groups read back: element j of every group from word (j * b) // 32 of its group, shifted down, with
    # the next word's low bits above it when it spans two. Temporaries: a few times one block.
    stream = np.ascontiguousarray(packed, dtype="<u4")
    out = np.empty(count, dtype=np.uint32)
    low = np.uint32((1 << bits) - 1)
    block = _block()
    for start in range(0, count, block):
        size = min(block, count - start)
        groups = -(-size // 32)
        base = start * bits // 32
        padded = np.zeros(groups * bits, dtype=np.uint32)
        chunk = stream[base:base + padded.size]
        padded[:chunk.size] = chunk
        rows = np.ascontiguousarray(padded.reshape(groups, bits).T)
        columns = np.empty((32, groups), dtype=np.uint32)
        spill = np.empty(groups, dtype=np.uint32)
        for j in range(32):
            word, shift = divmod(j * bits, 32)
            np.right_shift(rows[word], np.uint32(shift), out=columns[j])
            if shift + bits > 32:
                np.left_shift(rows[word + 1], np.uint32(32 - shift), out=spill)
                columns[j] |= spill
        columns &= low
        out[start:start + size] = columns.T.reshape(-1)[:size]
    return out


def signed(total: np.ndarray, bits: int) -> np.ndarray:
    """Ring elements of Z_2^32 reduced modulo 2^bits and read as two's complement integers (int64)."""
    _check(bits)
    low = np.asarray(total, dtype=np.uint32).astype(np.int64) & ((1 << bits) - 1)
    return np.where(low >= 1 << (bits - 1), low - (1 << bits), low)


def _block() -> int:
    """UNPACK_BLOCK, checked to be whole groups of 32 elements (each block then starts on a word of its own)."""
    if UNPACK_BLOCK < 32 or UNPACK_BLOCK % 32:
        raise ValueError(f"UNPACK_BLOCK {UNPACK_BLOCK} is not a positive multiple of 32: a block would not start on a word")
    return UNPACK_BLOCK


def _check(bits: int) -> None:
    if not 2 <= bits <= RING_BITS:
        raise ValueError(f"a ring of 2^{bits}: the ring has 2 to {RING_BITS} bits")
