"""A corrupt or hostile checkpoint or open-round file fails start-up with an error naming what is wrong (found in
review: some were run on, "false" read as finished, a round of -5, weights of another layout or of strings, and a
string median claim crashed the loop at the first update)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator.state.checkpoint import CheckpointStore
from tests.unit.coordinator.test_engine import Clock, hello, make_engine, send, update


def two_rounds(tmp_path: Path, clock: Clock) -> None:
    """A run whose round 1 closed (checkpointed) and round 2 is open (its open-round file written)."""
    engine, _, _ = make_engine(tmp_path, clock)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()


def weights_of(data: dict[str, Any]) -> dict[str, Any]:
    return data["strategy"]["families"]["f"]["weights"]


CASES: dict[str, tuple[str, Callable[[dict[str, Any]], object], str]] = {
    # case: (state file, the change, what the error must name)
    "finished as a string": ("checkpoint", lambda d: d.update(finished="false"), "finished"),
    "a round below 1": ("checkpoint", lambda d: d.update(next_round=-5), "next_round"),
    "run id not a string": ("checkpoint", lambda d: d.update(run_id=12345), "run_id"),
    "no algorithm": ("checkpoint", lambda d: d.pop("algorithm"), "algorithm"),
    "a summary of nothing": ("checkpoint", lambda d: d.update(last_summary={"bogus": 1}), "last_summary"),
    "non-finite weights": ("checkpoint", lambda d: weights_of(d).update(w=np.full((2, 3), np.nan, np.float32)),
                           "w is not finite"),
    "weights of strings": ("checkpoint", lambda d: weights_of(d).update(w="zzz"), "f's w"),
    "weights of another layout": ("checkpoint", lambda d: weights_of(d).update(w=np.zeros((7, 7), np.float32)),
                                  "not laid out as the task pinned"),
    "a median claim of words": ("open_round", lambda d: d.update(median_claim="lots"), "median_claim"),
    "an epoch of words": ("freshness", lambda d: d.update(epoch="soon"), "soon"),
    # Found in review: these failed with a bare KeyError, TypeError or ProtocolError naming no file; now the state
    # directory is named (the message's start: "the state in <state dir> ... cannot be resumed").
    "strategy without families": ("checkpoint", lambda d: d.update(strategy={}), "cannot be resumed"),
    "a family state without its round": ("checkpoint", lambda d: d["strategy"]["families"]["f"].pop("round"),
                                         "cannot be resumed"),
    "open round without run_id": ("open_round", lambda d: d.pop("run_id"), "cannot be resumed"),
    "open round announcement of junk": ("open_round", lambda d: d.update(announcement=b"\xc1junk"),
                                        "cannot be resumed"),
    "freshness mark of words": ("freshness", lambda d: d.update(agents={"a": ["x", "y", "z", "w"]}),
                                "cannot be resumed"),
    "freshness agents not a map": ("freshness", lambda d: d.update(agents=[1, 2]), "cannot be resumed"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_state_file_fails_start_up_naming_what_is_wrong(tmp_path: Path, case: str) -> None:
    name, change, named = CASES[case]
    clock = Clock()
    two_rounds(tmp_path, clock)
    store = CheckpointStore(tmp_path / "state")
    data = {k: v for k, v in store.load(name).items() if k != "format"}
    change(data)
    store.save(name, data)
    with pytest.raises((ValueError, RuntimeError), match=named):  # CheckpointError is a RuntimeError
        make_engine(tmp_path, clock)
