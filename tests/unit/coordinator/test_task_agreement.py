"""The coordinator's side of agreeing on a task: cards, pinned layouts, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from coordinator.admission.task_agreement import TaskAgreement, fingerprint_of
from coordinator.settings import CoordinatorSettings
from protocol.messages import AgentStatus, LocalTraining, RoundAnnouncement, TaskRef, TrainMetrics, Update
from protocol.tasks import BUILTIN_CARDS, TaskCard
from protocol.wire import encode_message
from tests.unit.coordinator.test_engine import LAYOUT as SENT_LAYOUT
from tests.unit.coordinator.test_engine import TOPICS, Clock, make_engine

DIGITS = BUILTIN_CARDS["digits"]
ARRAYS = {"w": np.zeros((2, 3), np.float32)}
LAYOUT = fingerprint_of(ARRAYS)
OTHER = fingerprint_of({"w": np.zeros((3, 3), np.float32)})


def status(agent_id: str, layout: str = LAYOUT, ref: TaskRef = DIGITS.ref, family: str = "cnn_small",
           problem: str | None = None) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state="online", device="rpi", family=family, num_samples=1,
                       num_eval_samples=0, version="t", timestamp=0.0, task_ref=ref, layout=layout, problem=problem)


def announcement(layouts: dict[str, str]) -> RoundAnnouncement:
    return RoundAnnouncement(run_id="r", round=1, task="train", task_ref=DIGITS.ref, layouts=layouts, algorithm="fedavg",
                             training=LocalTraining(epochs=1, learning_rate=0.1), selected=["a"], init_seed=0,
                             issued_at=0.0, deadline_s=1.0, last_round=1)


def update(ref: TaskRef = DIGITS.ref, **payload: object) -> Update:
    return Update(run_id="r", agent_id="a", round=1, task="train", task_ref=ref, family="cnn_small", base_digest=None,
                  num_samples=1, metrics=TrainMetrics(), **payload)


def test_a_family_layout_is_pinned_by_most_agents_then_kept() -> None:
    agreement = TaskAgreement(DIGITS)
    agreement.pin([status("a"), status("b"), status("c", OTHER), status("x", OTHER, TaskRef(name="acme", version="1"))],
                  {})
    assert agreement.layouts == {"cnn_small": LAYOUT}  # two of three; the other task's agent has no vote
    agreement.pin([status("c", OTHER), status("d", OTHER)], {})
    assert agreement.layouts == {"cnn_small": LAYOUT}  # pinned for the run
    assert agreement.status_problem(status("a")) is None
    assert agreement.status_problem(status("c", OTHER)) == f"its cnn_small model has layout {OTHER}, the run's is {LAYOUT}"


def test_a_tie_pins_nothing_and_global_states_outrank_agents() -> None:
    tie = TaskAgreement(DIGITS)
    tie.pin([status("a", OTHER), status("b", LAYOUT)], {})
    assert tie.layouts == {}  # one hello must not decide for the other: wait for more agents
    assert tie.status_problem(status("b")) is None  # waiting is not a mismatch: nothing is counted against it
    tie.pin([status("a", OTHER), status("b", LAYOUT), status("c", LAYOUT)], {})
    assert tie.layouts == {"cnn_small": LAYOUT} and tie.status_problem(status("b")) is None
    from_state = TaskAgreement(DIGITS)
    from_state.pin([status("a", OTHER), status("b", OTHER)], {"cnn_small": ARRAYS})
    assert from_state.layouts["cnn_small"] == LAYOUT  # the global state's weights outrank what agents say


def test_agents_of_another_task_or_that_refuse_are_not_eligible() -> None:
    agreement = TaskAgreement(DIGITS)
    assert agreement.status_problem(status("a", ref=TaskRef(name="digits", version="2"))) == (
        "runs task digits@2, this run trains digits@1")
    assert agreement.status_problem(status("a", problem="round 3 trains task x@1")) == (
        "it refuses rounds: round 3 trains task x@1")


def test_updates_of_another_task_or_layout_are_task_mismatch() -> None:
    agreement = TaskAgreement(DIGITS)
    ann = announcement({"cnn_small": LAYOUT})
    assert agreement.check_update(update(weights=ARRAYS), ann) is None
    cases = [
        (update(TaskRef(name="acme", version="1"), weights=ARRAYS), ann, "task acme@1, the round's is digits@1"),
        (update(delta={"w": np.zeros((3, 3), np.float32)}), ann, f"delta of layout {OTHER}, announced {LAYOUT}"),
        (update(weights=ARRAYS), announcement({}), "announced no layout for family cnn_small"),
        (update(prototypes=np.zeros((10, 32), np.float32), prototype_counts=np.ones(10, np.int64)), ann,
         "prototypes are [10, 32], task digits@1 has [10, 64]"),
    ]
    for bad, round_announcement, message in cases:
        problem = agreement.check_update(bad, round_announcement)
        assert problem is not None and problem.reason.value == "task_mismatch" and message in problem.detail


def test_the_checkpoint_keeps_layouts_and_refuses_another_task() -> None:
    agreement = TaskAgreement(DIGITS)
    agreement.pin([status("a")], {})
    restored = TaskAgreement(DIGITS)
    restored.load_state_dict(agreement.state_dict(), "here")
    assert restored.layouts == {"cnn_small": LAYOUT}
    with pytest.raises(ValueError, match="is a run of task digits@1, not mnist-5k@1"):
        TaskAgreement(BUILTIN_CARDS["mnist-5k"]).load_state_dict(agreement.state_dict(), "here")
    with pytest.raises(ValueError, match="layouts must map family names to fingerprints"):
        restored.load_state_dict({"name": "digits", "version": "1", "layouts": {"f": 3}}, "here")


def test_settings_take_a_builtin_name_or_a_card_file(tmp_path: Path) -> None:
    assert CoordinatorSettings(task="mnist-5k").task_card() == BUILTIN_CARDS["mnist-5k"]
    card = TaskCard(name="acme", version="2.1", classes=("ok", "dent"), families=("small",))
    path = tmp_path / "acme.json"
    path.write_text(card.to_json())
    assert CoordinatorSettings(task=str(path)).task_card() == card
    with pytest.raises(ValidationError, match="algorithm fedproto cannot run task .*declares no embedding"):
        CoordinatorSettings(task=str(path), algorithm="fedproto")
    with pytest.raises(ValidationError, match="task\n.*not a built-in task .*edge-agent tasks --card acme"):
        CoordinatorSettings(task="acme")
    (tmp_path / "bad.json").write_text('{"name": "acme", "version": "1", "classes": ["x"], "families": ["a"]}')
    with pytest.raises(ValidationError, match="task card .*bad.json: .*at least two classes"):
        CoordinatorSettings(task=str(tmp_path / "bad.json"))


def test_made_up_families_neither_overflow_a_round_nor_crowd_out_the_cards() -> None:
    """A round announces at most 64 families. 70 agents, each the whole majority of a family the card does not
    list, pin only as many as leave room for the card's own three, which still pin after them."""
    agreement = TaskAgreement(DIGITS)
    agreement.pin([status(f"x{i}", family=f"made-up-{i:02d}") for i in range(70)], {})
    assert len(agreement.layouts) == 64 - len(DIGITS.families)
    agreement.pin([status(f"c{i}", family=family) for i, family in enumerate(DIGITS.families)], {})
    assert len(agreement.layouts) == 64 and set(DIGITS.families) <= agreement.layouts.keys()
    agreement.pin([status("late", family="made-up-99")], {})
    assert "made-up-99" not in agreement.layouts


def test_65_made_up_families_do_not_stop_the_coordinator(tmp_path: Path) -> None:
    """Each a 1-of-1 majority: pinned all, the 65 would overflow the announcement and raise out of the tick."""
    engine, _, _ = make_engine(tmp_path, Clock())
    for i in range(65):
        engine.on_message(TOPICS.agent_status(f"a{i}"), encode_message(status(f"a{i}", SENT_LAYOUT,
                                                                             family=f"made-up-{i:02d}")))
    engine.tick()
    assert engine.engine.run.open is not None and len(engine.engine.run.open.announcement.layouts) <= 64
