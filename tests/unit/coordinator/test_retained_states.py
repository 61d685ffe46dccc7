"""What the coordinator clears from the broker's retained global states, chunked or not, across restarts."""

from __future__ import annotations

from pathlib import Path

from coordinator.state.checkpoint import CheckpointStore
from coordinator.state.retained import RetainedStates
from protocol.topics import Topics

TOPICS = Topics("t")


def test_a_newer_state_clears_every_topic_the_one_it_supersedes_used(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    retained = RetainedStates()
    assert retained.published("f", 2, "d2", chunks=3) == []
    assert retained.published("f", 3, "d3", chunks=1) == [(2, 3)]  # all three chunk topics of round 2
    assert TOPICS.global_state_topics("f", 2, 3) == [f"fl/t/global/f/2/{i}" for i in range(3)]
    assert retained.published("f", 4, "d4", chunks=2) == [(3, 1)]  # round 3's plain topic
    record = retained.unsaved()
    assert record is not None and retained.unsaved() is None  # written once, until the next change
    store.save("retained", record)

    restarted = RetainedStates()  # a crash between publishing and clearing
    restarted.load(store.load("retained"))
    assert restarted.on_broker == {"f": (4, 2)}
    assert restarted.published("f", 4, "d4", chunks=2) == []  # the same state again: nothing to clear
    assert restarted.published("f", 4, "d4b", chunks=1) == [(4, 2)]  # now plain: its chunk topics go
    assert restarted.published("f", 4, "d4c", chunks=3) == [(4, 1)]  # now chunked: the plain topic goes
    assert restarted.published("f", 4, "d4d", chunks=2) == [(4, 3)]  # fewer chunks: the caller keeps 0 and 1


def test_a_record_of_an_older_format_loads_as_unchunked(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save("retained", {"rounds": {"f": 5}})  # written before chunk topics existed
    retained = RetainedStates()
    retained.load(store.load("retained"))
    assert retained.on_broker == {"f": (5, 1)}
