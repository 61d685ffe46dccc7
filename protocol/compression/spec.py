"""Compression spec strings (``none``, or a registered compressor's kind, e.g. ``fp16``, ``int8``,
``topk:F``), re-exported by :mod:`protocol.compression`.

Two readings of the same text: :meth:`CompressionSpec.parse` accepts only ``none`` and the
kinds registered in :data:`~protocol.compression.registry.COMPRESSORS` (a setting, or what an
agent is about to apply); the wire type :data:`Compression` also accepts a kind this version
does not know, so that an older agent decodes the round and declines it with a reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, StringConstraints
from pydantic_core import PydanticCustomError

from protocol.compression.registry import COMPRESSORS
from protocol.registry import UnknownName

MAX_TEXT = 64
OPEN_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A compressor kind on the wire: the identifier rule of ``protocol.messages.IDENTIFIER_PATTERN``
(which imports this module); an unknown kind may carry any printable argument after ``:``."""
_OPEN_TEXT = re.compile(rf"{OPEN_KIND.pattern}(:[\x21-\x7e]*)?")


def kind_of(text: str) -> str:
    """The kind a spec text names (``topk`` of ``topk:0.1``), known or not."""
    return text.strip().partition(":")[0]


def _usage() -> str:
    forms = ["none", *(entry.value.usage for entry in COMPRESSORS)]
    return f"expected {', '.join(forms[:-1])} or {forms[-1]}"


@dataclass(frozen=True)
class CompressionSpec:
    """How updates are compressed; ``str(spec)`` is the canonical text that :meth:`parse` reads back."""

    kind: str = "none"
    """``none`` or a registered compressor."""
    fraction: float | None = None
    """The compressor's numeric argument (topk: the fraction of entries kept, 0 < fraction <= 1);
    None for a kind that takes none."""

    def __post_init__(self) -> None:
        if self.kind == "none" or (isinstance(self.kind, str) and self.kind in COMPRESSORS):
            argument = None if self.kind == "none" else COMPRESSORS.get(self.kind).argument
        else:
            raise ValueError(f"unknown compression kind {self.kind!r}: {_usage()}")
        if argument is None:
            if self.fraction is not None:
                raise ValueError(f"{self.kind} takes no fraction")
        else:
            object.__setattr__(self, "fraction", argument(self.fraction))  # canonical: topk:1 reads back as 1.0

    @classmethod
    def parse(cls, text: str) -> CompressionSpec:
        if not isinstance(text, str) or len(text) > MAX_TEXT:
            raise ValueError(f"compression {str(text)[:MAX_TEXT]!r}: {_usage()}")
        kind, sep, argument = text.strip().partition(":")
        if kind != "none" and kind not in COMPRESSORS:
            raise ValueError(f"unknown compression {text!r}: {_usage()}")
        takes = None if kind == "none" else COMPRESSORS.get(kind).argument
        if takes is None:
            if sep:
                raise ValueError(f"compression {text!r}: {kind} takes no argument")
            return cls(kind)
        try:
            return cls(kind, takes(argument))
        except ValueError as exc:
            raise ValueError(f"compression {text!r}: {exc}") from None

    def __str__(self) -> str:
        return self.kind if self.fraction is None else f"{self.kind}:{self.fraction!r}"

    def kept(self, n: int) -> int:
        """Entries a fraction-taking compressor (topk) keeps of ``n``: max(1, ceil(fraction * n)),
        exact for the fraction as written; ``n`` for every other kind."""
        if self.fraction is None:
            return n
        return min(n, max(1, math.ceil(Decimal(repr(float(self.fraction))) * n))) if n else 0


def _check_compression_text(text: str) -> str:
    """A known kind must be well formed (``topk:2`` is an error); an unknown one only a name."""
    kind = kind_of(text)
    try:
        if kind == "none" or kind in COMPRESSORS:
            CompressionSpec.parse(text)
        elif not _OPEN_TEXT.fullmatch(text):
            raise ValueError(f"compression {text!r} is not KIND or KIND:ARGUMENT")
    except (ValueError, UnknownName) as exc:
        raise PydanticCustomError("schema", "{problem}", {"problem": str(exc)}) from None
    return text


Compression = Annotated[str, StringConstraints(max_length=MAX_TEXT), AfterValidator(_check_compression_text)]
"""A message field holding a compression spec's text (e.g. ``RoundAnnouncement.compression``):
``none``, a known kind written as :meth:`CompressionSpec.parse` reads it, or an unknown kind."""
