"""The coordinator's retained messages: its status and the global states, sent again whenever they may be lost."""

from __future__ import annotations

from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState
from protocol.messages import CoordinatorStatus, TaskAnnouncement
from protocol.version import SOFTWARE_VERSION
from protocol.wire import encode_message


def publish_states(parts: EngineParts, run: RunState) -> int:
    """Every family's global state not yet retained on this connection; the bytes sent."""
    return parts.publisher.states(parts.strategy.states, run.run_id, run.epoch)


def publish_task(parts: EngineParts, run: RunState, *, force: bool = False) -> None:
    """The run's card (retained), when what is agreed changed since it was last published, or ``force``
    (after every connect: the broker may have lost it, or still hold an older run's)."""
    if not force and run.task_revision == parts.task.revision:
        return
    run.task_revision = parts.task.revision
    parts.publisher.task(TaskAnnouncement(run_id=run.run_id or "none", card=parts.task.published_card(),
                                          timestamp=parts.wall_clock(), epoch=run.epoch))


def publish_status(parts: EngineParts, run: RunState, state: str) -> None:
    parts.publisher.status(coordinator_status(parts, run, state, run.current_round))


def coordinator_status(parts: EngineParts, run: RunState, state: str, round_number: int) -> CoordinatorStatus:
    return CoordinatorStatus(
        federation=parts.settings.federation, run_id=run.run_id or "none", session=run.session, state=state,
        round=round_number, algorithm=parts.strategy.algorithm, version=SOFTWARE_VERSION,
        timestamp=parts.wall_clock(), epoch=run.epoch)


def offline_status(parts: EngineParts, run: RunState) -> bytes:
    """The last will: published by the broker if this process dies."""
    status = coordinator_status(parts, run, "offline", max(run.next_round - 1, 0))
    return parts.publisher.sealed(encode_message(status))
