"""The run's task card on the wire, refusal notices to agents, and two live processes under one agent id."""

from __future__ import annotations

from pathlib import Path

from coordinator.fleet.notices import DuplicateWatch, NoticeLimiter
from protocol.arrays import layout_of
from protocol.messages import AgentStatus, Notice, TaskAnnouncement
from protocol.tasks import BUILTIN_CARDS, FamilyLayout
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT, TOPICS, Clock, hello, make_engine, send, update, weights


def card_file(tmp_path: Path) -> Path:
    """digits@1 as an operator's card declaring family f's layout: that of the arrays these tests send."""
    card = BUILTIN_CARDS["digits"].model_copy(update={
        "families": ("f",), "layouts": {"f": FamilyLayout.of(layout_of(weights(0.0)))}})
    path = tmp_path / "card.json"
    path.write_text(card.to_json())
    return path


def notices(outbox: object, agent_id: str) -> list[Notice]:
    return [decode_message(p, Notice) for t, p, _ in outbox.sent if t == TOPICS.notices(agent_id)]  # type: ignore[attr-defined]


def cards(outbox: object) -> list[TaskAnnouncement]:
    return [decode_message(p, TaskAnnouncement) for t, p, _ in outbox.sent if t == TOPICS.task]  # type: ignore[attr-defined]


def test_the_card_is_retained_before_round_one_and_again_once_a_majority_fixes_a_layout(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock)  # the built-in card: no layouts declared
    first = cards(outbox)
    assert len(first) == 1 and [r for t, _, r in outbox.sent if t == TOPICS.task] == [True]
    assert first[0].card.ref == DIGITS and first[0].card.layouts == {} and first[0].epoch == engine.run.epoch > 0
    hello(engine, "a", family="cnn_small", model="1" * 32)
    hello(engine, "b", family="cnn_small", model="1" * 32)
    engine.tick()
    latest = cards(outbox)[-1]
    assert latest.card.layouts == {"cnn_small": FamilyLayout(fingerprint="1" * 32)}  # fingerprint known, arrays not yet
    engine.tick()
    assert len(cards(outbox)) == 2  # republished only when what is agreed changes


def test_a_card_that_declares_the_layout_refuses_a_wrong_first_hello_and_tells_it(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock, task=str(card_file(tmp_path)))
    published = cards(outbox)[0].card
    assert published.layouts["f"].fingerprint == LAYOUT and [a.name for a in published.layouts["f"].arrays] == ["w", "b"]
    assert engine.parts.task.layouts == {"f": LAYOUT}  # from the card, before any hello
    hello(engine, "wrong", model="0" * 32)
    (notice,) = notices(outbox, "wrong")
    assert (notice.reason, notice.about, notice.agent_id) == ("task_mismatch", "status", "wrong")
    assert LAYOUT in notice.detail and notice.epoch == engine.run.epoch
    hello(engine, "a")
    hello(engine, "b")
    engine.tick()
    assert engine.open is not None and engine.open.selected == ["a", "b"]
    hello(engine, "wrong", model="0" * 32)  # every status is refused, but the notice is rate-limited
    assert len(notices(outbox, "wrong")) == 1
    clock.now += engine.settings.notice_interval_s
    hello(engine, "wrong", model="0" * 32)
    assert len(notices(outbox, "wrong")) == 2
    assert metrics.registry.get_sample_value("fl_notices_sent_total", {"reason": "task_mismatch"}) == 2


def test_the_minority_of_a_majority_vote_is_told_at_once(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock, min_available_agents=3, min_fit_agents=2)
    hello(engine, "wrong", model="0" * 32)
    hello(engine, "a")
    hello(engine, "b")
    assert notices(outbox, "wrong") == []  # nothing decided yet: a wait, not a refusal
    engine.tick()
    assert engine.parts.task.layouts == {"f": LAYOUT}
    (notice,) = notices(outbox, "wrong")
    assert notice.reason == "task_mismatch" and "0" * 32 in notice.detail


def test_a_refused_update_earns_a_notice_naming_its_round(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, _ = make_engine(tmp_path, clock)
    hello(engine, "a")
    hello(engine, "b")
    engine.tick()
    late = update(engine, "a", 1).model_copy(update={"run_id": "another-run"})
    send(engine, late)
    (notice,) = notices(outbox, "a")
    assert (notice.reason, notice.about, notice.round) == ("wrong_run", "update", 1)


def test_what_failed_authentication_earns_no_notice(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock)
    engine.on_message(TOPICS.update("a", 1), b"\x81\xa1v\x01garbage")
    status = AgentStatus(agent_id="b", state="online", device="rpi", family="f", num_samples=1, num_eval_samples=1,
                         version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT)
    engine.on_message(TOPICS.agent_status("a"), encode_message(status))  # names b on a's topic
    assert notices(outbox, "a") == notices(outbox, "b") == []
    assert metrics.registry.get_sample_value("fl_messages_rejected_total",
                                             {"kind": "agent_status", "reason": "topic_mismatch"}) == 1


def status_of(session: str, epoch: int, seq: int) -> bytes:
    return encode_message(AgentStatus(
        agent_id="dup", state="online", device="rpi", family="f", num_samples=5, num_eval_samples=1, version="t",
        timestamp=0.0, task_ref=DIGITS, layout=LAYOUT, session=session, epoch=epoch, seq=seq))


def test_two_live_processes_with_one_agent_id_are_reported_and_a_restart_is_not(tmp_path: Path) -> None:
    clock = Clock()
    engine, outbox, metrics = make_engine(tmp_path, clock)
    engine.on_message(TOPICS.agent_status("dup"), status_of("old", 100, 1))
    engine.on_message(TOPICS.agent_status("dup"), status_of("old", 100, 2))
    engine.on_message(TOPICS.agent_status("dup"), status_of("new", 200, 1))  # a restart: a newer process
    engine.on_message(TOPICS.agent_status("dup"), status_of("new", 200, 2))
    engine.on_message(TOPICS.agent_status("dup"), status_of("old", 100, 2))  # a replay of the old one: stale only
    assert notices(outbox, "dup") == [] and not metrics.registry.get_sample_value("fl_duplicate_agent_ids_total")
    engine.on_message(TOPICS.agent_status("dup"), status_of("old", 100, 3))  # the old process is alive
    (notice,) = notices(outbox, "dup")
    assert notice.reason == "duplicate_agent_id" and "two live processes use agent id dup" in notice.detail
    assert metrics.registry.get_sample_value("fl_duplicate_agent_ids_total") == 1
    # One client id: the notice reached only the process connected then (the old one, which just published).
    # The newest process is told when its own next status shows it connected, and each only once.
    engine.on_message(TOPICS.agent_status("dup"), status_of("new", 200, 3))
    engine.on_message(TOPICS.agent_status("dup"), status_of("new", 200, 4))
    assert [n.reason for n in notices(outbox, "dup")] == ["duplicate_agent_id"] * 2


def test_notice_limiter_and_duplicate_watch_on_their_own() -> None:
    limiter = NoticeLimiter(10.0, capacity=2)
    assert limiter.allow("a", "late", 0.0) and not limiter.allow("a", "late", 9.9) and limiter.allow("a", "late", 10.0)
    assert limiter.allow("a", "wrong_run", 0.0) and limiter.allow("b", "late", 0.0)
    assert limiter.allow("a", "late", 10.5)  # pushed out by the capacity: allowed again, memory stays bounded
    assert not NoticeLimiter(0.0).allow("a", "late", 0.0)  # 0: notices off
    watch = DuplicateWatch()
    assert watch.check("x", "s1", 5, 1, None) is None
    assert watch.check("x", "s2", 5, 1, ("s1", 5)) is not None  # two processes at one epoch
    assert watch.check("y", "s1", 5, 0, ("s2", 6)) is None  # a last will says nothing
    assert watch.check("z", None, 0, 4, ("s2", 6)) is None  # an agent predating sessions


def test_a_checkpoint_trained_with_another_layout_than_the_card_declares_refuses_to_resume(tmp_path: Path) -> None:
    import pytest

    from coordinator.admission.task_agreement import TaskAgreement
    from protocol.tasks import load_task_card

    agreement = TaskAgreement(load_task_card(str(card_file(tmp_path))))
    saved = {"name": "digits", "version": "1", "layouts": {"f": "1" * 32}}
    with pytest.raises(ValueError, match=f"family f was trained with layout {'1' * 32}, the task card declares {LAYOUT}"):
        agreement.load_state_dict(saved, "state")
    agreement.load_state_dict({**saved, "layouts": {"f": LAYOUT, "g": "2" * 32}}, "state")  # agreeing: resumed
    assert agreement.layouts == {"f": LAYOUT, "g": "2" * 32}
