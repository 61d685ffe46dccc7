"""The messages of the four stages, as plain data (the wiring gives them a wire form), and the
plaintext of one encrypted share bundle.

Stage 1 Advertisement: agent -> server -> its neighbours (two X25519 public keys).
Stage 2 share bundles: agent -> server -> each neighbour, AEAD-encrypted (ChaCha20-Poly1305) with a
        key only the two agents can derive; the server relays bytes it cannot read.
Stage 3 masked input: agent -> server, uint32[n_params] (same size as a float32 update).
Stage 4 UnmaskRequest (server -> survivors: who uploaded) and UnmaskResponse (survivor -> server:
        self-mask shares of surviving neighbours, key shares of dropped ones, never both for one).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from protocol.secagg.shamir import CHUNKS, SHARE_BYTES

NONCE_BYTES = 12
_HEADER = struct.Struct("<II")  # sender, recipient (roster positions)
PLAINTEXT_BYTES = _HEADER.size + 2 * SHARE_BYTES
BUNDLE_BYTES = NONCE_BYTES + PLAINTEXT_BYTES + 16  # + Poly1305 tag


@dataclass(frozen=True)
class Advertisement:
    agent: str
    encryption_key: bytes  # X25519 public key for the share encryption keys
    mask_key: bytes  # X25519 public key for the pairwise mask seeds
    self_mask_commitment: bytes  # seed_commitment(context, b): lets the server check the seed it rebuilds

    @property
    def nbytes(self) -> int:
        return len(self.encryption_key) + len(self.mask_key) + len(self.self_mask_commitment)


def seed_commitment(context: bytes, seed: bytes) -> bytes:
    """SHA-256 of the round context and a 256-bit random seed: binding, and it hides the seed."""
    return hashlib.sha256(b"edgefl/secagg/v1/self-mask" + context + seed).digest()


@dataclass(frozen=True)
class UnmaskRequest:
    survivors: frozenset[str]  # the agents whose masked input is in the sum


@dataclass(frozen=True)
class UnmaskResponse:
    agent: str
    self_mask_shares: dict[str, np.ndarray]  # surviving neighbour -> its share of that neighbour's self-mask seed
    key_shares: dict[str, np.ndarray]  # dropped neighbour -> its share of that neighbour's mask private key

    @property
    def nbytes(self) -> int:
        return SHARE_BYTES * (len(self.self_mask_shares) + len(self.key_shares))


def seal_bundle(key: bytes, context: bytes, sender: int, recipient: int, self_mask_share: np.ndarray,
                key_share: np.ndarray) -> bytes:
    """Encrypt ``sender``'s two shares for ``recipient``; the header and the round context are authenticated."""
    plaintext = _HEADER.pack(sender, recipient) + _share_bytes(self_mask_share) + _share_bytes(key_share)
    nonce = os.urandom(NONCE_BYTES)
    return nonce + ChaCha20Poly1305(key).encrypt(nonce, plaintext, context)


def open_bundle(key: bytes, context: bytes, sender: int, recipient: int, bundle: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(self-mask share, key share) from a bundle; ValueError if it was not sealed for this pair and round."""
    if len(bundle) != BUNDLE_BYTES:
        raise ValueError(f"a share bundle has {BUNDLE_BYTES} bytes, not {len(bundle)}")
    try:
        plaintext = ChaCha20Poly1305(key).decrypt(bundle[:NONCE_BYTES], bundle[NONCE_BYTES:], context)
    except InvalidTag as exc:
        raise ValueError("a share bundle does not open with the pair's key (tampered, or for another round)") from exc
    if _HEADER.unpack_from(plaintext) != (sender, recipient):
        raise ValueError("a share bundle names another sender or recipient")
    shares = np.frombuffer(plaintext, dtype="<u4", offset=_HEADER.size).reshape(2, CHUNKS)
    return shares[0].astype(np.uint32), shares[1].astype(np.uint32)


def _share_bytes(share: np.ndarray) -> bytes:
    share = np.asarray(share)
    if share.shape != (CHUNKS,):
        raise ValueError(f"a share has {CHUNKS} elements")
    return share.astype("<u4").tobytes()
