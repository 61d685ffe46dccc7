"""Damaged or hand-edited state files (found in review) stop start-up with a CheckpointError naming the state
directory, not a bare KeyError, TypeError or ProtocolError from deep inside resume."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.state.checkpoint import CheckpointError, CheckpointStore
from tests.unit.coordinator.test_engine import Clock, make_engine
from tests.unit.coordinator.test_hostile_checkpoint import two_rounds

CASES: dict[str, tuple[str, Callable[[dict[str, Any]], object]]] = {
    "strategy without families": ("checkpoint", lambda d: d.update(strategy={})),
    "a family state without its round": ("checkpoint", lambda d: d["strategy"]["families"]["f"].pop("round")),
    "open round without run_id": ("open_round", lambda d: d.pop("run_id")),
    "open round announcement of junk": ("open_round", lambda d: d.update(announcement=b"\xc1junk")),
    "freshness mark of words": ("freshness", lambda d: d.update(agents={"a": ["x", "y", "z", "w"]})),
    "freshness agents not a map": ("freshness", lambda d: d.update(agents=[1, 2])),
}


@pytest.mark.parametrize("case", CASES)
def test_a_damaged_state_file_fails_start_up_naming_the_file(tmp_path: Path, case: str) -> None:
    name, change = CASES[case]
    clock = Clock()
    two_rounds(tmp_path, clock)
    store = CheckpointStore(tmp_path / "state")
    data = {k: v for k, v in store.load(name).items() if k != "format"}
    change(data)
    store.save(name, data)
    with pytest.raises(CheckpointError) as info:
        make_engine(tmp_path, clock)
    assert str(tmp_path / "state") in str(info.value) and "cannot be resumed" in str(info.value)
