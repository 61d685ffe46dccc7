"""The agent's reading of the run's task card and of the coordinator's refusal notices."""

from __future__ import annotations

import logging

import pytest

from edge_agent.coordinator_notes import CoordinatorNotes
from protocol.messages import Notice, TaskAnnouncement
from protocol.tasks import BUILTIN_CARDS, FamilyLayout
from tests.task_refs import DIGITS

OURS = "a" * 32


def card(**layouts: str) -> TaskAnnouncement:
    declared = {family: FamilyLayout(fingerprint=fp) for family, fp in layouts.items()}
    return TaskAnnouncement(run_id="r", card=BUILTIN_CARDS["digits"].model_copy(update={"layouts": declared}),
                            timestamp=0.0, epoch=1)


def notice(reason: str, agent_id: str = "phone-1", detail: str = "why") -> Notice:
    return Notice(run_id="r", agent_id=agent_id, about="update", reason=reason, detail=detail, round=3, timestamp=0.0)


def test_a_card_of_another_layout_or_task_rules_the_agent_out_until_it_matches() -> None:
    notes = CoordinatorNotes("phone-1", DIGITS, "mlp_tiny", OURS)
    assert not notes.on_task(card()) and notes.card_problem is None  # no layout declared: nothing to compare
    assert notes.on_task(card(mlp_tiny="b" * 32))
    assert notes.card_problem == f"its mlp_tiny model has layout {OURS}, the run's card declares {'b' * 32}"
    assert notes.on_task(card(mlp_tiny=OURS)) and notes.card_problem is None
    other = card().model_copy(update={"card": BUILTIN_CARDS["mnist-5k"]})
    assert notes.on_task(other) and notes.card_problem == "the run trains task mnist-5k@1, this agent runs digits@1"


def test_notices_are_kept_for_the_status_and_each_reason_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    notes = CoordinatorNotes("phone-1", DIGITS, "mlp_tiny", OURS)
    with caplog.at_level(logging.WARNING, logger="edge_agent.agent"):
        assert notes.on_notice(notice("late", detail="round 3 closed"))
        assert notes.on_notice(notice("late", detail="round 4 closed"))
        assert notes.on_notice(notice("norm_outlier"))
        assert not notes.on_notice(notice("late", agent_id="phone-2"))  # addressed to another agent
    assert notes.notice == "norm_outlier: why"
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 2 and "its update for round 3: late: round 3 closed" in refusals[0]
