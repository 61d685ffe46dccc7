"""What a receiver trusts: decoding a message that may come in a signed envelope.

A receiver with keys (an agent that pinned its coordinator's key; a coordinator that knows
its enrolled agents) verifies every signed message before decoding what it carries, and,
when it requires signatures, drops anything unsigned. One without keys unwraps signed
messages unverified: it trusts the broker, as before enrollment existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from protocol.errors import ProtocolError, Reason
from protocol.limits import DecodeLimits
from protocol.messages import Message, Signed
from protocol.security.signing import KeyLookup, unseal
from protocol.wire import decode_message

M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class Trust:
    lookup: KeyLookup | None = None
    """Keys that verify signed messages; None: signed messages are unwrapped unverified."""
    required: bool = False
    """Drop messages that are not signed by one of those keys."""

    def __post_init__(self) -> None:
        if self.required and self.lookup is None:
            raise ValueError("signatures cannot be required without keys to verify them")


OPEN = Trust()


@dataclass(frozen=True)
class Received(Generic[M]):
    message: M
    size: int
    """Bytes received for it (the whole payload, envelope included)."""
    signer: str | None
    """Owner of the key that verified it; None when it was not verified."""


def decode_trusted(payload: bytes | memoryview, expect: type[M], limits: DecodeLimits, trust: Trust) -> Received[M]:
    """Decode a message of kind ``expect``, alone or in a signed envelope, as ``trust`` allows."""
    return accept(decode_message(payload, (expect, Signed), limits), len(payload), expect, limits, trust)


def accept(message: Message, size: int, expect: type[M], limits: DecodeLimits, trust: Trust) -> Received[M]:
    """``message`` (already decoded) if ``trust`` accepts it; a signed envelope is verified and opened."""
    if isinstance(message, Signed):
        if trust.lookup is None:
            return Received(decode_message(message.payload, expect, limits), size, None)
        signer, inner = unseal(message, trust.lookup)
        return Received(decode_message(inner, expect, limits), size, signer)
    if trust.required:
        raise ProtocolError(Reason.UNSIGNED, f"an unsigned {type(message).model_fields['kind'].default} message")
    assert isinstance(message, expect)
    return Received(message, size, None)
