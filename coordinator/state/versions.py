"""Digests of each family's recent global versions: what a stale update's base is checked against."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

_DIGEST = re.compile(r"^[0-9a-f]{32}$")


class _State(Protocol):
    round: int
    digest: str


class VersionLog:
    """Keeps the last ``keep + 1`` versions of every family (a few strings each), in the checkpoint."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._digests: dict[str, dict[int, str]] = {}

    def record(self, states: Mapping[str, _State], version: int) -> None:
        """Note what version ``version`` announces for every family.

        Keyed by the announced version, not by ``state.round``: a family that had no update in the
        last buffer keeps its older state, and its agents, training from version ``version``, report
        that version as their base's number.
        """
        for family, state in states.items():
            versions = self._digests.setdefault(family, {})
            versions[version] = state.digest
            for old in [r for r in versions if r < version - self.keep]:
                del versions[old]

    def digest(self, family: str, round_number: int) -> str | None:
        return self._digests.get(family, {}).get(round_number)

    def state_dict(self) -> dict[str, Any]:
        return {family: {str(r): d for r, d in versions.items()} for family, versions in self._digests.items()}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        digests: dict[str, dict[int, str]] = {}
        for family, versions in saved.items():
            if not isinstance(versions, dict) or not all(
                    isinstance(r, str) and r.isdigit() and isinstance(d, str) and _DIGEST.match(d)
                    for r, d in versions.items()):
                raise ValueError(f"checkpoint: versions of {family!r} must map round numbers to digests")
            digests[family] = {int(r): d for r, d in versions.items()}
        self._digests = digests
