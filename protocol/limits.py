"""Bounds enforced while decoding, before anything large is allocated."""

from __future__ import annotations

from dataclasses import dataclass, field

MiB = 1024 * 1024

DEFAULT_DTYPES = frozenset(
    {"<f2", "<f4", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1"}
)


@dataclass(frozen=True)
class DecodeLimits:
    """What one message may contain. Every decode is checked against one of these."""

    max_payload_bytes: int = 256 * MiB
    max_array_elements: int = 64_000_000
    max_total_elements: int = 128_000_000
    max_container_len: int = 100_000
    max_items: int = 500_000
    """Array elements and map entries in the whole message, at every depth: each becomes a Python object (an
    empty list or map costs 56 to 72 bytes from 1 byte on the wire), so this bounds what a message can make the
    decoder build before the signature is checked (16 MiB of empty lists was 1.1 GB and 17 s before it)."""
    max_str_len: int = 1 * MiB
    max_ndim: int = 8
    allowed_dtypes: frozenset[str] = field(default=DEFAULT_DTYPES)

    def __post_init__(self) -> None:
        for name in ("max_payload_bytes", "max_array_elements", "max_total_elements",
                     "max_container_len", "max_items", "max_str_len", "max_ndim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DecodeLimits.{name} must be positive")


DEFAULT_LIMITS = DecodeLimits()
