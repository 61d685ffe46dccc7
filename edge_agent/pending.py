"""What an agent keeps of its own updates: the last one sent (to resend to a coordinator that may have
lost it) and one held back by the straggler simulation."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.messages import Update


@dataclass
class SentUpdate:
    """The last update published, kept to send again to a coordinator that may have lost it."""

    run_id: str
    round: int
    pieces: list[bytes]
    session: str | None
    """The coordinator session it was last sent to (None: no coordinator status seen yet)."""


@dataclass
class HeldUpdate:
    """A finished update held back by the straggler simulation until ``due`` (monotonic clock)."""

    update: Update
    due: float
