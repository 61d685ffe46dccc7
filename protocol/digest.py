"""Content digests of named arrays: what a round announcement pins each family to."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np

from protocol.ndarray_ext import as_wire_array


def digest_arrays(groups: Iterable[tuple[str, Mapping[str, np.ndarray]]]) -> str:
    """BLAKE2b-128 over group names, array names, dtypes, shapes and bytes, in order.

    Arrays are digested as they travel (little-endian, C order, like the codec writes them),
    so a digest computed before encoding matches the one computed after decoding.
    """
    h = hashlib.blake2b(digest_size=16)
    for group, arrays in groups:
        h.update(f"[{group}]".encode())
        for name, array in arrays.items():
            contiguous = as_wire_array(array)
            h.update(f"{name}:{contiguous.dtype.str}:{contiguous.shape};".encode())
            h.update(memoryview(contiguous).cast("B") if contiguous.size else b"")
    return h.hexdigest()


def digest_bytes(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()
