"""The agent's durable state directory: identity, progress, and algorithm state.

Everything is written atomically, so a device that loses power mid-write keeps the old
file. Arrays are stored with the wire codec, never pickle.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from protocol.codec import decode, encode
from protocol.limits import DecodeLimits
from protocol.topics import check_identifier
from service_kit.durable import atomic_write_bytes
from service_kit.state_claim import LOCK_FILE, StateDirClaim, StateDirInUse

_LOCAL_LIMITS = DecodeLimits(max_payload_bytes=4 * 1024**3, max_array_elements=2**31, max_total_elements=2**32,
                             max_items=2**31)


__all__ = ["AgentStateDir", "LOCK_FILE", "StateDirClaim", "StateDirInUse"]  # the claim lives in service_kit


class AgentStateDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def agent_id(self, prefix: str, proposed: str | None = None) -> str:
        """The id made on first start and kept ever after, so a rebooted device is the same agent:
        ``proposed`` (a client certificate's CN) if given, else ``prefix`` and a random suffix."""
        path = self.root / "agent_id"
        if path.exists():
            return check_identifier(path.read_text().strip(), f"agent id in {path}")
        agent_id = (check_identifier(proposed, "agent id (the certificate's CN)") if proposed
                    else f"{prefix}-{secrets.token_hex(4)}")
        atomic_write_bytes(path, agent_id.encode())
        return agent_id

    def read_json(self, name: str) -> dict[str, Any] | None:
        path = self.root / f"{name}.json"
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # the ledger's own checks say what a reset costs
            raise ValueError(f"{path} is corrupt: {exc}; restore it from a backup, or move it away to reset "
                             f"it (for privacy.json: the privacy budget starts again)") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object")
        return data

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        atomic_write_bytes(self.root / f"{name}.json", json.dumps(data, indent=1).encode())

    def read_arrays(self, name: str) -> dict[str, np.ndarray] | None:
        path = self.root / f"{name}.msgpack"
        if not path.exists():
            return None
        data = decode(path.read_bytes(), _LOCAL_LIMITS)
        if not isinstance(data, dict) or not all(isinstance(v, np.ndarray) for v in data.values()):
            raise ValueError(f"{path} does not hold named arrays")
        return {k: np.array(v) for k, v in data.items()}

    def write_arrays(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        atomic_write_bytes(self.root / f"{name}.msgpack", encode(arrays))

    def remove(self, name: str) -> None:
        for suffix in (".json", ".msgpack"):
            (self.root / f"{name}{suffix}").unlink(missing_ok=True)

    def names(self, prefix: str = "") -> list[str]:
        """Names of the entries (JSON or arrays) that start with ``prefix``."""
        found = set()
        for path in self.root.iterdir():
            for suffix in (".json", ".msgpack"):
                if path.is_file() and path.name.endswith(suffix) and path.name.startswith(prefix):
                    found.add(path.name[: -len(suffix)])
        return sorted(found)

    def remove_matching(self, prefix: str, keep: str) -> list[str]:
        """Remove every entry named ``prefix...`` except ``keep`` (e.g. an earlier run's state)."""
        stale = [name for name in self.names(prefix) if name != keep]
        for name in stale:
            self.remove(name)
        return stale
