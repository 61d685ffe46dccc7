"""Enrolled agents: the public key each device signs with, kept in a JSON file in the state dir.

``coordinator enroll`` adds devices to the file (a running coordinator picks them up without a
restart: the file is read again when an unknown key signs something, at most once a second).
With enrollment required (the default), the coordinator accepts statuses and updates only when
they are signed by the key enrolled for the agent they name; an unenrolled sender never enters
the registry.

File format: ``{"format": 1, "agents": {"<agent id>": {"key": "ed25519:<base64>", "max_samples": N}}}``
(``max_samples`` optional: the most samples that agent may claim as its weight).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from protocol.security.signing import PublicKey
from protocol.topics import check_identifier
from service_kit.durable import atomic_write_bytes
from service_kit.startup import CannotStart

log = logging.getLogger(__name__)

FORMAT = 1
RELOAD_EVERY_S = 1.0


@dataclass(frozen=True)
class EnrolledAgent:
    agent_id: str
    key: PublicKey
    max_samples: int | None = None


class EnrollmentError(CannotStart, ValueError):
    """The enrollment file exists but cannot be used."""


def read_enrollment(path: Path) -> dict[str, EnrolledAgent]:
    """The agents enrolled in ``path`` (none if it does not exist); raises EnrollmentError naming the problem."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("agents"), dict):
            raise ValueError(f"expected {{'format': {FORMAT}, 'agents': {{...}}}}")
        agents = {}
        for agent_id, entry in data["agents"].items():
            check_identifier(agent_id, "agent id")
            max_samples = entry.get("max_samples")
            if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 1):
                raise ValueError(f"{agent_id}: max_samples must be a positive integer")
            agents[agent_id] = EnrolledAgent(agent_id, PublicKey.from_text(entry["key"]), max_samples)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EnrollmentError(f"{path}: {exc}") from None
    return agents


def enroll(path: Path, agent_id: str, key: PublicKey, max_samples: int | None = None) -> None:
    """Add or replace ``agent_id``'s entry, atomically (a running coordinator reads the file at any time)."""
    check_identifier(agent_id, "agent id")
    agents = read_enrollment(path)
    agents[agent_id] = EnrolledAgent(agent_id, key, max_samples)
    entries = {a.agent_id: {"key": a.key.to_text(), **({"max_samples": a.max_samples} if a.max_samples else {})}
               for a in sorted(agents.values(), key=lambda a: a.agent_id)}
    atomic_write_bytes(path, (json.dumps({"format": FORMAT, "agents": entries}, indent=1) + "\n").encode())


class Enrollment:
    """The enrolled agents, looked up by signing key; re-read when the file changes."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self._by_key: dict[str, EnrolledAgent] = {}
        self._by_agent: dict[str, EnrolledAgent] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = -1e9
        self._reload()

    def lookup(self, key_id: str) -> tuple[str, PublicKey] | None:
        """(agent id, key) for a key enrolled here; None for any other key."""
        found = self._by_key.get(key_id)
        if found is None and self.clock() - self._checked >= RELOAD_EVERY_S:
            self._reload()
            found = self._by_key.get(key_id)
        return None if found is None else (found.agent_id, found.key)

    def get(self, agent_id: str) -> EnrolledAgent | None:
        return self._by_agent.get(agent_id)

    def max_samples_of(self, agent_id: str) -> int | None:
        """The sample cap enrolled for this agent; None: none of its own."""
        enrolled = self._by_agent.get(agent_id)
        return None if enrolled is None else enrolled.max_samples

    def __len__(self) -> int:
        return len(self._by_agent)

    def agent_ids(self) -> list[str]:
        """Every enrolled agent, the file read again if it changed (at most once a second)."""
        if self.clock() - self._checked >= RELOAD_EVERY_S:
            self._reload()
        return list(self._by_agent)

    def _reload(self) -> None:
        self._checked = self.clock()
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            agents = read_enrollment(self.path)
        except EnrollmentError as exc:
            if self._stamp is None:
                raise  # at start-up: refuse to run on a broken file
            log.error("kept the enrolled agents as they were: %s", exc)
            return
        self._stamp = stamp
        self._by_agent = agents
        self._by_key = {a.key.key_id: a for a in agents.values()}
        log.info("%d agents enrolled (%s)", len(agents), self.path)
