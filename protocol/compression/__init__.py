"""Update and state compression on the wire: what a compressed payload is, and how to read it.

``spec`` parses a run's compression setting, ``packing`` packs and unpacks arrays, and
``error_feedback`` keeps what lossy compression dropped for the next update.
"""

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
from protocol.compression.spec import Compression, CompressionSpec

__all__ = ["MAX_PACKED_ELEMENTS", "Compression", "CompressionSpec", "ErrorFeedback", "PackedArray",
           "check_packed_layout", "half_precision", "pack", "pack_arrays", "packed_bytes", "raw_bytes",
           "split_compressible", "to_float16", "unpack", "unpack_arrays", "widen_half"]
