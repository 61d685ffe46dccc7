"""X25519 key pairs and the 32-byte keys derived from them (HKDF-SHA256, full strength).

Each agent makes two fresh key pairs per round (Bonawitz et al. 2017): one to encrypt the shares
it sends its neighbours, one whose agreement with a neighbour's gives the pairwise mask seed.
Every derived key is bound to the round (HKDF salt = the round's context digest) and to its use
and direction (HKDF info), so no key serves two purposes or two rounds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

KEY_BYTES = 32
MASK_INFO = b"edgefl/secagg/v1/pairwise-mask"
SHARE_KEY_INFO = b"edgefl/secagg/v1/share-encryption"


@dataclass(frozen=True)
class KeyPair:
    private: X25519PrivateKey
    public: bytes  # raw 32 bytes, as advertised

    @classmethod
    def generate(cls) -> KeyPair:
        private = X25519PrivateKey.generate()
        return cls(private, public_bytes(private))

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyPair:
        private = X25519PrivateKey.from_private_bytes(raw)
        return cls(private, public_bytes(private))

    def private_bytes(self) -> bytes:
        return self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def clamped(raw: bytes) -> bytes:
    """A 32-byte X25519 private key in its one canonical form (RFC 7748 clamping: what X25519 uses of it). Keys are
    shared in this form, so a rebuilt key is checked bit for bit, not only through its public key: the bits
    clamping ignores would let a wrong share open a key that passes."""
    if len(raw) != 32:
        raise ValueError(f"an X25519 private key has 32 bytes, not {len(raw)}")
    return bytes([raw[0] & 248, *raw[1:31], (raw[31] & 127) | 64])


def public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _derive(shared: bytes, context: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=context, info=info).derive(shared)


def agree(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The raw X25519 shared secret; refuses a peer key that gives the all-zero (low-order) secret."""
    if len(peer_public) != KEY_BYTES:
        raise ValueError(f"a public key has {KEY_BYTES} bytes, not {len(peer_public)}")
    return private.exchange(X25519PublicKey.from_public_bytes(peer_public))  # raises on a low-order point


def mask_seed(private: X25519PrivateKey, peer_public: bytes, context: bytes, a: int, b: int) -> bytes:
    """The 32-byte seed of the pairwise mask between agents ``a`` and ``b`` (roster positions);
    the same from either side."""
    low, high = sorted((a, b))
    return _derive(agree(private, peer_public), context, MASK_INFO + struct.pack("<II", low, high))


def share_key(private: X25519PrivateKey, peer_public: bytes, context: bytes, sender: int, recipient: int) -> bytes:
    """The AEAD key for the one message ``sender`` encrypts to ``recipient`` in this round."""
    return share_key_from(agree(private, peer_public), context, sender, recipient)


def share_key_from(shared: bytes, context: bytes, sender: int, recipient: int) -> bytes:
    """``share_key`` from the raw secret ``agree`` gave: an agent seals to a neighbour and opens what that
    neighbour sealed to it with one agreement (the two keys differ by direction, not by secret)."""
    return _derive(shared, context, SHARE_KEY_INFO + struct.pack("<II", sender, recipient))
