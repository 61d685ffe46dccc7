"""What a round policy decides: when rounds close, whom they select, and its part of admitting updates."""

from __future__ import annotations

from abc import ABC, abstractmethod

from coordinator.admission.decisions import Decision
from coordinator.admission.view import AdmissionView
from coordinator.state.rounds import OpenRound
from protocol.messages import Update
from protocol.topics import ParsedTopic


class RoundPolicy(ABC):
    name: str
    missing_are_stragglers: bool = True
    """Selected agents without an answer at the deadline count as stragglers (synchronous rounds)."""
    defers: bool = False
    """Whether ``decide`` may answer Defer (the engine then holds such updates for the next round)."""

    @abstractmethod
    def decide(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Decision:
        """Accept (with what weight), Reject (why) or Defer an update that is on its topic and of this run.

        Reads the view, changes nothing; ``coordinator.admission.updates.admit_update`` frames it with
        the checks every policy shares."""

    def selection(self, task: str, fraction: float, minimum: int, over_selection: float) -> tuple[float, int, float]:
        """(fraction, minimum, over-selection) of the available agents a round selects."""
        if task == "train":
            return fraction, minimum, over_selection
        return 1.0, 1, 0.0  # the evaluation round asks every agent it may

    def wanted(self, task: str, planned: int) -> int:
        """Updates that close a round before its deadline."""
        return planned

    def oldest_round(self, open_number: int) -> int:
        """The oldest round whose updates this policy may still take while round ``open_number`` is open: older ones
        are refused before their chunks are held (a replayed old transfer must not take the sender's slots)."""
        return open_number

    def closes(self, open_round: OpenRound, now: float) -> bool:
        return open_round.enough_answered() or now >= open_round.deadline
