"""atomic_write_bytes leaves its temporary file behind when the process is SIGKILLed mid-write (the except clause
never runs): each crash during a checkpoint write (up to GBs) leaked a partial copy (found in review). The
coordinator removes them as it resumes; a reader of the state leaves them alone."""
from __future__ import annotations

from pathlib import Path

from tests.unit.coordinator.test_engine import Clock, make_engine
from tests.unit.coordinator.test_hostile_checkpoint import two_rounds


def test_a_restart_removes_a_checkpoint_write_torn_by_a_crash(tmp_path: Path) -> None:
    clock = Clock()
    two_rounds(tmp_path, clock)
    state = tmp_path / "state"
    torn = state / ".checkpoint.msgpack.k1ll3d.tmp"  # as mkstemp names it; SIGKILL before os.replace
    torn.write_bytes(b"\x00" * 4096)
    again, _, _ = make_engine(tmp_path, clock)
    assert again.open is not None
    assert not torn.exists(), sorted(p.name for p in state.iterdir())  # fails: leaked for good


def test_a_reader_of_the_checkpoint_leaves_a_live_write_alone(tmp_path: Path) -> None:
    """fl-evaluate opens the checkpoint store of a running coordinator: the write in flight is not its to remove."""
    from coordinator.state.checkpoint import CheckpointStore

    two_rounds(tmp_path, Clock())
    live = tmp_path / "state" / ".checkpoint.msgpack.inflight.tmp"
    live.write_bytes(b"\x00" * 16)
    assert CheckpointStore(tmp_path / "state").load("checkpoint") is not None
    assert live.exists()
