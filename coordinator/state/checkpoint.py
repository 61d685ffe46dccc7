"""Durable coordinator state: written atomically after every round, read at start."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from protocol.codec import decode, encode
from protocol.errors import ProtocolError
from protocol.limits import DecodeLimits
from service_kit.durable import atomic_write_bytes, remove_torn_writes

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
CHECKPOINT = "checkpoint"
"""The run's checkpoint (other state files: ``open_round``, ``retained``)."""
_LIMITS = DecodeLimits(max_payload_bytes=8 * 1024**3, max_array_elements=2**31, max_total_elements=2**33,
                       max_container_len=10_000_000, max_items=2**31, max_str_len=64 * 1024 * 1024)


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used; starting fresh would silently lose rounds."""


class CheckpointStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def remove_torn_writes(self) -> None:
        """For the process that writes here, at its start (a reader, such as ``fl-evaluate``, must not: it would
        delete a live write): what a crash left of writes it tore."""
        for torn in remove_torn_writes(self.directory):
            log.warning("removed %s, a write torn by a crash", torn)

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.msgpack"

    def save(self, name: str, data: dict[str, Any]) -> int:
        payload = encode({"format": CHECKPOINT_FORMAT, **data})
        atomic_write_bytes(self.path(name), payload)
        return len(payload)

    def load(self, name: str) -> dict[str, Any] | None:
        path = self.path(name)
        if not path.exists():
            return None
        try:
            data = decode(path.read_bytes(), _LIMITS)
        except ProtocolError as exc:
            raise CheckpointError(f"{path} is corrupt ({exc}); move it away to start a new run") from None
        if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"{path} has an unknown format; move it away to start a new run")
        return data
