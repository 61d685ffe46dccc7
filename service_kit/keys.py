"""Signing keys on disk: a service's own key, created once and kept readable by its owner only."""

from __future__ import annotations

from pathlib import Path

from protocol.security.signing import SigningKey
from service_kit.durable import atomic_write_bytes


def save_signing_key(key: SigningKey, path: Path) -> None:
    atomic_write_bytes(path, key.to_pem())
    path.chmod(0o600)


def load_or_create_signing_key(path: Path) -> SigningKey:
    """The key in ``path``; a new one written there (mode 0600) if the file does not exist."""
    if path.exists():
        return SigningKey.load(path)
    key = SigningKey.generate()
    save_signing_key(key, path)
    return key
