"""Messages to bytes and back: the codec plus schema validation."""

from __future__ import annotations

from typing import TypeVar, overload

from pydantic import ValidationError

from protocol.codec import decode, encode
from protocol.errors import ProtocolError, Reason
from protocol.limits import DEFAULT_LIMITS, DecodeLimits
from protocol.messages import MESSAGE_TYPES, Message
from protocol.version import SCHEMA_VERSION

M = TypeVar("M", bound=Message)

# Custom validation error types raised inside the models that have a reason of their own.
_REASON_BY_ERROR_TYPE = {
    "non_finite": Reason.NON_FINITE,
    "finite_number": Reason.NON_FINITE,  # pydantic's error for a NaN or Inf float field
    "bad_shape": Reason.BAD_SHAPE,
    "digest_mismatch": Reason.DIGEST_MISMATCH,
}


def encode_message(message: Message) -> bytes:
    return encode(message.model_dump(mode="python"))


@overload
def decode_message(payload: bytes | bytearray | memoryview, expect: type[M], limits: DecodeLimits = ...) -> M: ...
@overload
def decode_message(payload: bytes | bytearray | memoryview, expect: tuple[type[Message], ...],
                   limits: DecodeLimits = ...) -> Message: ...
@overload
def decode_message(payload: bytes | bytearray | memoryview, expect: None = None, limits: DecodeLimits = ...) -> Message: ...


def decode_message(
    payload: bytes | bytearray | memoryview,
    expect: type[Message] | tuple[type[Message], ...] | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> Message:
    """Decode and validate one message; ``expect`` restricts which kind(s) are acceptable, checked
    from the ``kind`` field before the (possibly costly) validation of the body.

    Raises only :class:`ProtocolError`.
    """
    obj = decode(payload, limits)
    if not isinstance(obj, dict):
        raise ProtocolError(Reason.SCHEMA, f"top level is {type(obj).__name__}, expected a map")
    version = obj.get("v")
    if type(version) is not int or version != SCHEMA_VERSION:  # not True, not 1.0: the integer itself
        raise ProtocolError(Reason.UNSUPPORTED_VERSION, f"schema version {obj.get('v')!r}, expected {SCHEMA_VERSION}")
    kind = obj.get("kind")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(Reason.SCHEMA, f"unknown message kind {kind!r}"[:120])
    accepted = (expect,) if isinstance(expect, type) else expect
    if accepted is not None and cls not in accepted:
        names = ", ".join(str(c.model_fields["kind"].default) for c in accepted)
        raise ProtocolError(Reason.WRONG_KIND, f"got {kind}, expected {names}")
    try:
        return cls.model_validate(obj)
    except ValidationError as exc:
        raise protocol_error(exc) from None


def protocol_error(exc: ValidationError) -> ProtocolError:
    """The ProtocolError for a message model's validation failure (NaN/Inf, shape, digest, schema)."""
    errors = exc.errors(include_url=False, include_input=False)
    for error in errors:
        reason = _REASON_BY_ERROR_TYPE.get(error["type"])
        if reason is not None:
            return ProtocolError(reason, _describe(error))
    return ProtocolError(Reason.SCHEMA, f"{len(errors)} error(s), first: {_describe(errors[0])}")


def _describe(error: dict) -> str:
    location = ".".join(str(part) for part in error["loc"]) or "message"
    return f"{location}: {error['msg']}"[:200]
