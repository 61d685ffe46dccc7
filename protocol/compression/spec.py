"""Compression spec strings (none, fp16, int8, topk:F), re-exported by :mod:`protocol.compression`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, StringConstraints
from pydantic_core import PydanticCustomError

KINDS = ("none", "fp16", "int8", "topk")
_USAGE = "expected none, fp16, int8 or topk:F with 0 < F <= 1"


@dataclass(frozen=True)
class CompressionSpec:
    """How updates are compressed; ``str(spec)`` is the canonical text that :meth:`parse` reads back."""

    kind: Literal["none", "fp16", "int8", "topk"] = "none"
    fraction: float | None = None
    """topk only: the fraction of entries kept, 0 < fraction <= 1."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown compression kind {self.kind!r}: {_USAGE}")
        if self.kind != "topk":
            if self.fraction is not None:
                raise ValueError(f"{self.kind} takes no fraction")
        elif isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) \
                or not (math.isfinite(self.fraction) and 0 < self.fraction <= 1):
            raise ValueError(f"topk fraction must be a number in (0, 1], got {self.fraction!r}")
        else:
            object.__setattr__(self, "fraction", float(self.fraction))  # canonical: topk:1 reads back as 1.0

    @classmethod
    def parse(cls, text: str) -> CompressionSpec:
        if not isinstance(text, str) or len(text) > 64:
            raise ValueError(f"compression {str(text)[:64]!r}: {_USAGE}")
        kind, sep, argument = text.strip().partition(":")
        if kind == "topk":
            if not argument.strip():
                raise ValueError(f"compression {text!r}: topk needs a fraction, e.g. topk:0.01")
            try:
                fraction = float(argument)
            except ValueError:
                raise ValueError(f"compression {text!r}: topk fraction {argument!r} is not a number") from None
            if not (math.isfinite(fraction) and 0 < fraction <= 1):
                raise ValueError(f"compression {text!r}: topk fraction must be in (0, 1]")
            return cls("topk", fraction)
        if kind in KINDS:
            if sep:
                raise ValueError(f"compression {text!r}: {kind} takes no argument")
            return cls(kind)  # type: ignore[arg-type]
        raise ValueError(f"unknown compression {text!r}: {_USAGE}")

    def __str__(self) -> str:
        return f"topk:{self.fraction!r}" if self.kind == "topk" else self.kind

    def kept(self, n: int) -> int:
        """Entries top-k keeps of ``n``: max(1, ceil(fraction * n)), exact for the fraction as written."""
        if self.kind != "topk" or self.fraction is None:
            return n
        return min(n, max(1, math.ceil(Decimal(repr(float(self.fraction))) * n))) if n else 0


def _check_compression_text(text: str) -> str:
    try:
        CompressionSpec.parse(text)
    except ValueError as exc:
        raise PydanticCustomError("schema", "{problem}", {"problem": str(exc)}) from None
    return text


Compression = Annotated[str, StringConstraints(max_length=64), AfterValidator(_check_compression_text)]
"""A message field holding a compression spec's text (e.g. ``RoundAnnouncement.compression``)."""
