"""What a round policy decides, and the read-only view of the engine's state it decides on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.reasons import RejectedUpdate, RejectReason
from coordinator.state.rounds import OpenRound
from protocol.messages import Update
from protocol.topics import ParsedTopic


@dataclass(frozen=True)
class AdmissionView:
    """The state admission may read; it changes nothing. Lookups are functions so that a view costs
    nothing to make per message, however large the registry."""

    run_id: str
    next_round: int
    """The next round to open: rounds below it are closed."""
    open_round: OpenRound | None
    closing: bool
    """A round is being aggregated in the background; none is open until it is applied."""
    family_of: Callable[[str], str | None]
    """The family an agent's last status named; None: never heard of it."""
    sample_cap: Callable[[str], int]
    """The most samples (weight) an update of this agent may claim."""
    check_task: Callable[[Update], None]
    """The run's task and the announced layout (raises ``task_mismatch``)."""
    check_payload: Callable[[Update, bool], None]
    """The strategy's checks of a training payload; the flag says whether to check its base against the
    current global state (a stale update's base is checked against ``version_digest`` instead)."""
    version_digest: Callable[[str, int], str | None]
    """The digest of ``family``'s global state of an earlier ``round``, while it is remembered."""


@dataclass(frozen=True)
class Admission:
    staleness: int = 0
    """Global versions published since the update's base (0 in synchronous rounds)."""
    weight: float = 1.0
    """Multiplies the update's sample count in the weighted mean."""


class Defer(Exception):
    """Not now: hold the update and offer it again once the next round is open (asynchronous rounds)."""


class RoundPolicy(ABC):
    name: str
    missing_are_stragglers: bool = True
    """Selected agents without an answer at the deadline count as stragglers (synchronous rounds)."""

    @abstractmethod
    def admit(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Admission:
        """Accept (how, and with what weight), or raise RejectedUpdate (why) or Defer."""

    def selection(self, task: str, fraction: float, minimum: int, over_selection: float) -> tuple[float, int, float]:
        """(fraction, minimum, over-selection) of the available agents a round selects."""
        if task == "train":
            return fraction, minimum, over_selection
        return 1.0, 1, 0.0  # the evaluation round asks every agent it may

    def wanted(self, task: str, planned: int) -> int:
        """Updates that close a round before its deadline."""
        return planned

    def closes(self, open_round: OpenRound, now: float) -> bool:
        return open_round.enough_answered() or now >= open_round.deadline


def common_checks(topic: ParsedTopic, update: Update, view: AdmissionView) -> None:
    """What every policy requires first: the update is on its own topic and of this run."""
    if update.agent_id != topic.agent_id or update.round != topic.round:
        raise RejectedUpdate(RejectReason.TOPIC_MISMATCH,
                             f"update of {update.agent_id}/{update.round} on {topic.agent_id}/{topic.round}")
    if update.run_id != view.run_id:
        raise RejectedUpdate(RejectReason.WRONG_RUN, f"run {update.run_id}, expected {view.run_id}")


def agent_checks(update: Update, view: AdmissionView) -> None:
    """The family the agent's status named, and no more weight than it may claim."""
    family = view.family_of(update.agent_id)
    if family is not None and update.family != family:
        raise RejectedUpdate(RejectReason.WRONG_FAMILY, f"family {update.family}, status says {family}")
    cap = view.sample_cap(update.agent_id)
    if update.num_samples > cap:
        raise RejectedUpdate(RejectReason.TOO_MANY_SAMPLES, f"claims {update.num_samples} samples, at most {cap}")
