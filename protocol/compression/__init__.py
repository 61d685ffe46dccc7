"""Update and state compression on the wire: what a compressed payload is, and how to read it.

``registry`` holds the compressors, one file each (``fp16``, ``int8``, ``topk``) registering
itself; ``spec`` parses a run's compression setting, ``packing`` packs and unpacks arrays
through the registry, and ``error_feedback`` keeps what lossy compression dropped for the next
update. A new compressor is one file registering itself, imported below.
"""

from protocol.compression import fp16, int8, topk  # noqa: F401  (each registers itself, in this order)
from protocol.compression.error_feedback import ErrorFeedback
from protocol.compression.packing import (
    MAX_PACKED_ELEMENTS,
    PackedArray,
    check_packed_layout,
    half_precision,
    pack,
    pack_arrays,
    packed_bytes,
    raw_bytes,
    split_compressible,
    to_float16,
    unpack,
    unpack_arrays,
    widen_half,
)
from protocol.compression.registry import COMPRESSORS, Compressor, state_compressors
from protocol.compression.spec import Compression, CompressionSpec, kind_of

__all__ = ["COMPRESSORS", "MAX_PACKED_ELEMENTS", "Compression", "CompressionSpec", "Compressor", "ErrorFeedback",
           "PackedArray", "check_packed_layout", "half_precision", "kind_of", "pack", "pack_arrays", "packed_bytes",
           "raw_bytes", "split_compressible", "state_compressors", "to_float16", "unpack", "unpack_arrays",
           "widen_half"]
