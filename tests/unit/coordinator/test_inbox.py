"""The loop's inbox holds a bounded number of payload bytes: the network thread waits, nothing is lost."""

from __future__ import annotations

import threading

from coordinator.app.inbox import BoundedInbox


def test_a_full_inbox_holds_the_producer_until_the_loop_takes_items() -> None:
    inbox = BoundedInbox(max_bytes=100)
    inbox.put(("message", "t/0", b"x" * 60), 60)
    inbox.put(("connected", None, None))  # control events never wait
    second_in = threading.Event()

    def producer() -> None:
        inbox.put(("message", "t/1", b"x" * 60), 60)  # 120 > 100: waits for room
        second_in.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not second_in.wait(0.2) and inbox.queued_bytes == 60  # still held back
    assert inbox.get(1.0) == ("message", "t/0", b"x" * 60)
    assert second_in.wait(10)
    thread.join(10)
    assert [inbox.get(1.0), inbox.get(1.0)] == [("connected", None, None), ("message", "t/1", b"x" * 60)]
    assert inbox.get(0.01) is None and inbox.queued_bytes == 0


def test_one_item_larger_than_the_budget_still_passes_and_close_releases_a_waiting_producer() -> None:
    inbox = BoundedInbox(max_bytes=10)
    inbox.put(("message", "big", b""), 1_000)
    released = threading.Event()
    thread = threading.Thread(target=lambda: (inbox.put(("message", "more", b""), 5), released.set()))
    thread.start()
    inbox.close()
    assert released.wait(10)
    thread.join(10)
    assert inbox.get(0.01) is None
