"""The loop's inbox: one queue per sender, served in turn; bounded overall (the network thread waits, nothing is
lost) and per sender (what is over a sender's bound is refused at once); control events first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from coordinator.app.inbox import Bound, FairInbox

pytestmark = pytest.mark.timeout(60)


def message(sender: str, n: int) -> tuple[str, str, bytes]:
    return ("message", f"t/{sender}/{n}", b"")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def drain(inbox: FairInbox) -> list[object]:
    items = []
    while (item := inbox.get(timeout=0)) is not None:
        items.append(item)
    return items


def test_a_sender_with_10000_queued_delays_another_senders_message_by_at_most_one_turn() -> None:
    inbox = FairInbox(max_bytes=1 << 30)
    for n in range(10_000):
        inbox.put(message("flood", n), 10, sender="flood", lane="agent_status")
    inbox.put(message("honest", 0), 10, sender="honest", lane="update")
    assert inbox.senders == 2
    assert [inbox.get(0), inbox.get(0)] == [message("flood", 0), message("honest", 0)]
    inbox.put(message("honest", 1), 10, sender="honest", lane="update")  # arrives behind 9,999 of the flood's
    assert [inbox.get(0), inbox.get(0)] == [message("flood", 1), message("honest", 1)]
    rest = drain(inbox)
    assert rest == [message("flood", n) for n in range(2, 10_000)]  # each sender's own order is kept
    assert inbox.queued_bytes == 0 and inbox.senders == 0


def test_senders_are_served_in_turn_and_control_events_go_first() -> None:
    inbox = FairInbox(max_bytes=1 << 20)
    for sender in ("a", "b", "c"):
        for n in range(3 if sender != "b" else 1):
            inbox.put(message(sender, n), 1, sender=sender)
    inbox.put_control(("disconnected", None, None))
    inbox.put_control(("connected", "session", None))
    assert drain(inbox) == [("disconnected", None, None), ("connected", "session", None),
                            message("a", 0), message("b", 0), message("c", 0),
                            message("a", 1), message("c", 1), message("a", 2), message("c", 2)]
    assert inbox.get(timeout=0.01) is None


def test_a_sender_past_its_bound_is_refused_at_once_others_and_other_lanes_are_not() -> None:
    inbox = FairInbox(max_bytes=1 << 20, bounds={"agent_status": Bound(messages=3, bytes=100)})
    assert inbox.put(message("a", 0), 500, sender="a", lane="agent_status")  # a sender's first always gets in
    assert not inbox.put(message("a", 1), 1, sender="a", lane="agent_status")  # 501 bytes > 100
    assert inbox.get(0) == message("a", 0)
    assert [inbox.put(message("a", n), 30, sender="a", lane="agent_status") for n in range(1, 5)] == [
        True, True, True, False]  # three messages at most
    assert inbox.put(message("b", 0), 30, sender="b", lane="agent_status")  # another sender: its own bound
    assert all(inbox.put(message("a", n), 30, sender="a", lane="update") for n in range(10))  # no bound on updates
    assert inbox.get(0) == message("a", 1)  # a's turn frees one of its statuses
    assert inbox.put(message("a", 5), 30, sender="a", lane="agent_status")
    assert inbox.queued_bytes == 30 * (3 + 1 + 10)


def test_a_full_inbox_holds_the_network_thread_until_the_loop_takes_items() -> None:
    inbox = FairInbox(max_bytes=100, bounds={"update": Bound(messages=1, bytes=1000)})
    inbox.put(message("a", 0), 60, sender="a", lane="update")
    queued = threading.Event()
    thread = threading.Thread(target=lambda: (inbox.put(message("b", 0), 60, sender="b", lane="update"),
                                              queued.set()))
    thread.start()
    wait_for(lambda: inbox.waiting == 1, "the second put to wait for room")  # 120 > 100
    inbox.put_control(("connected", None, None))  # control events never wait
    # While one put waits (the network thread), a sender over its own bound is refused at once, not held.
    assert not inbox.put(message("a", 1), 1, sender="a", lane="update")
    assert not queued.is_set() and inbox.queued_bytes == 60
    assert inbox.get(1.0) == ("connected", None, None)
    assert inbox.get(1.0) == message("a", 0)
    assert queued.wait(10)
    thread.join(10)
    assert inbox.get(1.0) == message("b", 0)
    assert inbox.get(0.01) is None and inbox.queued_bytes == 0 and inbox.waiting == 0


def test_one_item_larger_than_the_budget_still_passes_and_close_releases_a_waiting_producer() -> None:
    inbox = FairInbox(max_bytes=10)
    assert inbox.put(("message", "big", b""), 1_000, sender="a")
    released = threading.Event()
    thread = threading.Thread(target=lambda: (inbox.put(("message", "more", b""), 5, sender="b"), released.set()))
    thread.start()
    wait_for(lambda: inbox.waiting == 1, "the second put to wait for room")
    inbox.close()
    assert released.wait(10)
    thread.join(10)
    assert inbox.get(0.01) is None and inbox.queued_bytes == 0
    assert inbox.put(("message", "late", b""), 5, sender="c")  # taken and discarded: nobody reads any more
    inbox.put_control(("disconnected", None, None))
    assert inbox.get(0.01) is None


def test_messages_of_no_size_are_bounded_in_number() -> None:
    inbox = FairInbox(max_bytes=1 << 20, max_messages=3)
    for n in range(3):
        inbox.put(message(f"s{n}", 0), 0, sender=f"s{n}")
    thread = threading.Thread(target=lambda: inbox.put(message("s3", 0), 0, sender="s3"))
    thread.start()
    wait_for(lambda: inbox.waiting == 1, "the fourth put to wait for room")
    assert inbox.get(1.0) == message("s0", 0)
    thread.join(10)
    assert drain(inbox) == [message(f"s{n}", 0) for n in (1, 2, 3)]
