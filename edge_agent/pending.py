"""What an agent keeps of its own updates: the last one sent (to resend to a coordinator that may have
lost it), one held back by the straggler simulation, and the round it last answered (``progress.json``)."""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.state import AgentStateDir
from protocol.messages import Update


@dataclass
class SentUpdate:
    """The last update published, kept to send again to a coordinator that may have lost it."""

    run_id: str
    round: int
    pieces: list[bytes]
    sessions: set[str]
    """The coordinator sessions it was sent to (empty: no coordinator status seen yet). Each gets it once: a replayed
    older status (signed, so it verifies) must not make the agent upload it again and again."""


@dataclass
class HeldUpdate:
    """A finished update held back by the straggler simulation until ``due`` (monotonic clock)."""

    update: Update
    due: float


def read_progress(state: AgentStateDir) -> tuple[str, int] | None:
    """The (run, round) this agent last answered, from ``progress.json``; ValueError naming the file if it is bad."""
    progress = state.read_json("progress") or {}
    if "run_id" not in progress:
        return None
    try:
        return str(progress["run_id"]), int(progress["round"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{state.root / 'progress.json'} is malformed ({exc!r}); move it away (the agent then "
                         f"may answer a round it answered before a restart once more)") from None


def write_progress(state: AgentStateDir, run_id: str, round_number: int) -> None:
    """The round this agent answered: a restarted agent answers no round it answered already (nor spends again)."""
    state.write_json("progress", {"run_id": run_id, "round": round_number})
