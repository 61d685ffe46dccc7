"""Ed25519 signatures over whole encoded messages, and the keys both sides keep.

Anyone may reach the broker, so a message is trusted for what its signature proves: the
coordinator signs its status, announcements and global states, agents pin its public key;
agents sign their statuses and updates with the key pair they got at enrollment, and the
coordinator knows their public keys. A signed message travels as a ``Signed`` envelope
(``protocol/messages.py``) around the inner message's bytes; chunking, when a broker caps
message size, splits the envelope, so the signature covers the payload whole.

Signatures cover ``DOMAIN + SHA-256(payload)``: hashing first (one pass, hardware-accelerated)
costs a fraction of Ed25519's own two SHA-512 passes over a multi-MB update, and the domain
tag means a signature made for this protocol cannot be replayed as one for anything else. Replays *within* the protocol (an old round's update,
another run's announcement) are stopped by the receivers' checks of run, round, agent and
expiry, which the signature makes trustworthy.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.errors import ProtocolError, Reason
from protocol.messages import Signed

DOMAIN = b"edgefl-signed-v1\x00"
TEXT_PREFIX = "ed25519:"


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key; ``key_id`` (16 hex digits of its SHA-256) names it on the wire."""

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != 32:
            raise ValueError(f"an Ed25519 public key has 32 bytes, got {len(self.raw)}")

    @property
    def key_id(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()[:16]

    def to_text(self) -> str:
        """``ed25519:<base64>``: one line, for flags, environment variables and enrollment files."""
        return TEXT_PREFIX + base64.b64encode(self.raw).decode()

    @classmethod
    def from_text(cls, text: str) -> PublicKey:
        text = text.strip()
        if not text.startswith(TEXT_PREFIX):
            raise ValueError(f"a public key reads {TEXT_PREFIX}<base64>, got {text[:24]!r}")
        try:
            return cls(base64.b64decode(text[len(TEXT_PREFIX):], validate=True))
        except ValueError as exc:
            raise ValueError(f"not a valid public key: {exc}") from None

    @classmethod
    def load(cls, value: str | Path) -> PublicKey:
        """From its text form, or from a file holding it."""
        text = str(value)
        if not text.strip().startswith(TEXT_PREFIX):
            path = Path(text)
            if not path.is_file():
                raise ValueError(f"{text!r} is neither {TEXT_PREFIX}<base64> nor a readable file")
            text = path.read_text()
        return cls.from_text(text)

    def verify(self, data: bytes | memoryview, signature: bytes) -> None:
        """Raise ProtocolError(bad_signature) unless ``signature`` is this key's over ``data``."""
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, _signed_bytes(data))
        except InvalidSignature:
            raise ProtocolError(Reason.BAD_SIGNATURE, f"signature does not verify with key {self.key_id}") from None


class SigningKey:
    """An Ed25519 private key, kept in a PEM file readable by its owner only."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = PublicKey(raw)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: Path) -> SigningKey:
        try:
            private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path} is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise ValueError(f"{path} holds a {type(private).__name__}, not an Ed25519 key")
        return cls(private)

    def to_pem(self) -> bytes:
        """The private key as unencrypted PKCS#8 PEM (``service_kit.keys`` stores it, mode 0600)."""
        return self._private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())

    def sign(self, data: bytes | memoryview) -> bytes:
        return self._private.sign(_signed_bytes(data))

    def seal(self, payload: bytes) -> Signed:
        """``payload`` (an encoded message) in a signed envelope."""
        # Built here, from values that are valid by construction: validating would copy the payload again.
        return Signed.model_construct(key_id=self.public_key.key_id, payload=payload, signature=self.sign(payload))


def _signed_bytes(data: bytes | memoryview) -> bytes:
    return DOMAIN + hashlib.sha256(data).digest()


KeyLookup = Callable[[str], "tuple[str, PublicKey] | None"]
"""key_id -> (owner, key) for the keys a receiver trusts, or None."""


def unseal(envelope: Signed, lookup: KeyLookup) -> tuple[str, bytes]:
    """(owner, payload) once the envelope's signature verifies with a trusted key; raises ProtocolError."""
    found = lookup(envelope.key_id)
    if found is None:
        raise ProtocolError(Reason.UNKNOWN_SIGNER, f"signed with key {envelope.key_id}, which is not trusted here")
    owner, key = found
    key.verify(envelope.payload, envelope.signature)
    return owner, envelope.payload


def single_key(owner: str, key: PublicKey) -> KeyLookup:
    """A lookup that trusts one key (an agent pins its coordinator's)."""
    return lambda key_id: (owner, key) if key_id == key.key_id else None
