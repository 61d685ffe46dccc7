"""The base of every wire model, in a module of its own so that field types defined outside
:mod:`protocol.messages` (e.g. :class:`protocol.compression.PackedArray`) can build on it and
still be used by the message models without a circular import."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    """Strict (no silent coercion), frozen, unknown fields rejected, floats finite."""

    model_config = ConfigDict(
        strict=True, frozen=True, extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True
    )
