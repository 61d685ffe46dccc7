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
    max_str_len: int = 1 * MiB
    max_ndim: int = 8
    allowed_dtypes: frozenset[str] = field(default=DEFAULT_DTYPES)

    def __post_init__(self) -> None:
        for name in ("max_payload_bytes", "max_array_elements", "max_total_elements",
                     "max_container_len", "max_str_len", "max_ndim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DecodeLimits.{name} must be positive")


DEFAULT_LIMITS = DecodeLimits()
