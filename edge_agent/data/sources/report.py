"""What a loader dropped or noticed, so a device can say why it has fewer samples than files.

Loaders drop noise (a corrupt image, a bad sensor row) and keep going, but raise
``DataSourceError`` for configuration mistakes (an unknown class, a missing column) that
training on the rest would silently hide.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

MAX_EXAMPLES = 3


class DataSourceError(ValueError):
    """A device's files do not fit the task; the message names the file and what to do."""


@dataclass
class LoadReport:
    dropped: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def drop(self, reason: str, where: str, count: int = 1) -> None:
        """Count ``count`` samples dropped for ``reason``; keep the first few places as examples."""
        self.dropped[reason] += count
        seen = self.examples.setdefault(reason, [])
        if len(seen) < MAX_EXAMPLES:
            seen.append(where)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def merge(self, other: LoadReport) -> LoadReport:
        """Fold ``other`` into this report (for a device with several sources); returns self."""
        self.dropped.update(other.dropped)
        for reason, places in other.examples.items():
            seen = self.examples.setdefault(reason, [])
            seen.extend(places[: MAX_EXAMPLES - len(seen)])
        self.warnings.extend(other.warnings)
        return self

    def summary(self) -> str:
        """One line, e.g. ``dropped 2 corrupt_image (a.png, b.png); 1 warning``."""
        parts = [f"dropped {n} {reason} ({', '.join(self.examples.get(reason, []))})"
                 for reason, n in sorted(self.dropped.items())]
        if self.warnings:
            parts.append(f"{len(self.warnings)} warning{'s' if len(self.warnings) != 1 else ''}")
        return "; ".join(parts) or "clean"
