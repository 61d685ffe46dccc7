"""The partials of the round a site closed last, kept to send again to a root that lost them.

A root that restarts during a round loses the partials it had taken (they live with its open round, not in its
checkpoint), and the site no longer takes its agents' updates for that round. So, as agents resend their updates,
the site sends its partials again when a new root session (the ``session`` of the root's signed status) has that
round open: once per session. A bridge that reconnects re-delivers the retained status and announcement of the same
session, and a replayed older status (signed, so it verifies) names a session already served: neither sends
anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Outgoing = list[tuple[str, bytes]]


@dataclass
class LastPartials:
    run_id: str = ""
    round: int = -1
    payloads: Outgoing = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)
    """The root sessions they went to (empty: sent before any root status was heard)."""

    def sent(self, run_id: str, round_number: int, payloads: Outgoing, session: str | None) -> None:
        self.run_id, self.round, self.payloads = run_id, round_number, list(payloads)
        self.sessions = set() if session is None else {session}

    def again(self, run_id: str, round_number: int, session: str | None) -> Outgoing:
        """What to send to root session ``session``, which has round ``round_number`` of ``run_id`` open."""
        if (run_id, round_number) != (self.run_id, self.round) or session is None or session in self.sessions:
            return []
        first = not self.sessions  # the first status heard after sending: the session they went to
        self.sessions.add(session)
        return [] if first else list(self.payloads)
