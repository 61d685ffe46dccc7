"""The one error raised for anything a remote party sent that we will not accept."""

from __future__ import annotations

from enum import Enum


class Reason(str, Enum):
    """Why a message was rejected. A bounded set: it is used as a metric label."""

    TOO_LARGE = "too_large"
    MALFORMED = "malformed"
    UNKNOWN_EXTENSION = "unknown_extension"
    BAD_DTYPE = "bad_dtype"
    TOO_MANY_ELEMENTS = "too_many_elements"
    BAD_SHAPE = "bad_shape"
    NON_FINITE = "non_finite"
    SCHEMA = "schema"
    UNSUPPORTED_VERSION = "unsupported_version"
    WRONG_KIND = "wrong_kind"
    BAD_TOPIC = "bad_topic"
    BAD_CHUNK = "bad_chunk"
    DIGEST_MISMATCH = "digest_mismatch"
    UNSIGNED = "unsigned"
    """A message that must be signed was not."""
    UNKNOWN_SIGNER = "unknown_signer"
    """Signed with a key the receiver does not trust (not the pinned coordinator, not an enrolled agent)."""
    BAD_SIGNATURE = "bad_signature"
    """The signature does not verify: forged, or changed on the way."""


class ProtocolError(ValueError):
    """A received payload failed decoding or validation.

    ``reason`` is machine-readable (for counters); ``detail`` is for the log line.
    """

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
