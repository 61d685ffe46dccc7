"""Updates opened on a pool ahead of the loop: the loop still sees the inbox's order, and an update opened off the
loop is received exactly as one opened on it (its delta carrying its norm, taken once)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from coordinator.admission.intake import Intake, Opened, Refused, UpdateIn
from coordinator.aggregation.running_mean import NormedArrays, l2_norm
from coordinator.app.inbox import FairInbox
from coordinator.app.openers import UPDATE, Openers
from protocol.messages import TrainMetrics, Update
from protocol.wire import encode_message
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import TOPICS, Clock, make_engine

pytestmark = pytest.mark.timeout(60)


def fill(inbox: FairInbox, items: list[tuple[str, str, bytes]]) -> None:
    for kind, topic, payload in items:
        inbox.put((kind, topic, payload), len(payload), sender=topic, lane=kind)


def test_the_loop_gets_items_in_the_inbox_order_though_a_later_update_opens_first() -> None:
    later_opened = threading.Event()

    def open_update(payload: bytes, topic: str) -> Opened:
        if payload == b"first":  # finishes only after the update behind it was opened
            assert later_opened.wait(10), "the second worker never opened the later update"
        else:
            later_opened.set()
        return Opened(payload, None)

    inbox = FairInbox(1 << 20)
    fill(inbox, [(UPDATE, "a", b"first"), (UPDATE, "b", b"second"), ("message", "c", b"status")])
    openers = Openers(inbox, open_update, workers=2)
    try:
        taken = [openers.next(timeout=1) for _ in range(3)]
    finally:
        openers.close()
    assert [item for item, _ in taken] == [(UPDATE, "a", b"first"), (UPDATE, "b", b"second"), ("message", "c", b"status")]
    assert [None if opened is None else opened.payload for _, opened in taken] == [b"first", b"second", None]
    assert openers.next(timeout=0) is None


def test_only_depth_items_leave_the_inbox_ahead_of_the_loop() -> None:
    inbox = FairInbox(1 << 20)
    fill(inbox, [(UPDATE, f"s{i}", b"x" * 10) for i in range(20)])
    openers = Openers(inbox, lambda payload, topic: Opened(payload, None), workers=2, depth=4)
    try:
        assert openers.next(timeout=1) is not None
        assert openers.pending == 4 and inbox.queued_bytes == 15 * 10
    finally:
        openers.close()


def test_without_workers_updates_are_opened_on_the_loop() -> None:
    calls: list[bytes] = []
    inbox = FairInbox(1 << 20)
    fill(inbox, [(UPDATE, "a", b"u")])
    openers = Openers(inbox, lambda payload, topic: calls.append(payload) or Opened(payload, None), workers=0)
    assert openers.next(timeout=1) == ((UPDATE, "a", b"u"), None)
    assert calls == []  # the engine's intake opens it when it receives it


def delta_update(agent_id: str, value: float) -> Update:
    delta = {"w": np.full((3, 5), value, dtype=np.float32), "b": np.arange(9000, dtype=np.float32) * value,
             "steps": np.array([3], dtype=np.int64)}
    return Update(run_id="r", agent_id=agent_id, round=2, task="train", task_ref=DIGITS, family="f",
                  base_digest="0" * 32, num_samples=10, delta=delta, metrics=TrainMetrics())


@pytest.fixture
def intake(tmp_path: Path) -> Intake:
    driver, _, _ = make_engine(tmp_path, Clock())
    return driver.engine.parts.intake


def test_an_update_opened_off_the_loop_is_received_as_one_opened_on_it(intake: Intake) -> None:
    payload = encode_message(delta_update("a", 0.25))
    inline = intake.receive(TOPICS.update("a", 2), payload, {})
    intake.hand(intake.open(payload, TOPICS.update("a", 2)))
    handed = intake.receive(TOPICS.update("a", 2), payload, {})
    assert isinstance(inline, UpdateIn) and isinstance(handed, UpdateIn)
    assert handed.update.model_dump(exclude={"delta"}) == inline.update.model_dump(exclude={"delta"})
    for name, array in inline.update.delta.items():
        np.testing.assert_array_equal(handed.update.delta[name], array)
    assert isinstance(handed.update.delta, NormedArrays)
    expected = float(np.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64)))
                                 for a in inline.update.delta.values() if a.dtype.kind == "f")))
    assert l2_norm(handed.update.delta) == pytest.approx(expected, rel=1e-12)


def test_an_opening_handed_for_another_message_is_not_used(intake: Intake) -> None:
    intake.hand(intake.open(encode_message(delta_update("a", 0.25)), TOPICS.update("a", 2)))
    received = intake.receive(TOPICS.update("b", 2), encode_message(delta_update("b", 0.5)), {})
    assert isinstance(received, UpdateIn) and received.update.agent_id == "b"


def test_a_bad_update_opened_off_the_loop_is_refused_for_the_same_reason(intake: Intake) -> None:
    payload = bytearray(encode_message(delta_update("a", 0.25)))
    payload[-40:] = b"\xff" * 40  # garbles the tail of the last array or what follows it
    broken = bytes(payload)
    inline = intake.receive(TOPICS.update("a", 2), broken, {})
    intake.hand(intake.open(broken, TOPICS.update("a", 2)))
    handed = intake.receive(TOPICS.update("a", 2), broken, {})
    assert isinstance(inline, Refused) and isinstance(handed, Refused)
    assert handed.reject == inline.reject


def test_normed_arrays_are_read_only_and_their_norm_is_the_float64_one() -> None:
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal(8193).astype(np.float32), "b": rng.standard_normal((3, 7)),
              "h": np.ones(5, np.float16), "i": np.arange(4)}
    expected = float(np.sqrt(sum(float(np.sum(np.square(a.astype(np.float64)))) for k, a in arrays.items() if k != "i")))
    assert l2_norm(arrays) == pytest.approx(expected, rel=1e-12)
    normed = NormedArrays(arrays, 7.0)
    assert l2_norm(normed) == 7.0  # carried, not taken again
    with pytest.raises(TypeError):
        normed["a"] = arrays["b"]
    with pytest.raises(TypeError):
        normed.update({"c": arrays["b"]})
