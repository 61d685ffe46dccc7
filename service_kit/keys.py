"""Signing keys on disk: a service's own key, created once and kept readable by its owner only."""

from __future__ import annotations

from pathlib import Path

from protocol.security.signing import SigningKey
from service_kit.durable import create_exclusive_bytes
from service_kit.startup import CannotStart


def load_or_create_signing_key(path: Path) -> SigningKey:
    """The key in ``path``; a new one written there (mode 0600) if the file does not exist. Two processes
    creating it at once (a coordinator starting while ``coordinator enroll`` runs) end up with the same key:
    the first to create the file wins, the other loads it. CannotStart names a file that is not a key."""
    try:
        if path.exists():
            return SigningKey.load(path)
        key = SigningKey.generate()
        if create_exclusive_bytes(path, key.to_pem()):
            return key
        return SigningKey.load(path)
    except (OSError, ValueError) as exc:
        raise CannotStart(f"signing key file {path}: {getattr(exc, 'strerror', None) or exc}") from exc
