"""A corrupt or hostile checkpoint or open-round file fails start-up with an error naming what is wrong (found in
review: some were run on, "false" read as finished, a round of -5, weights of another layout or of strings)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.state.checkpoint import CheckpointStore
from tests.unit.coordinator.test_engine import Clock, hello, make_engine, send, update

CLEAR = (ValueError, RuntimeError)  # ValueError / CheckpointError naming the field


def _two_rounds(tmp_path: Path, clock: Clock, **kw):
    engine, _, _ = make_engine(tmp_path, clock, **kw)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick(), engine.tick()  # round 1 closed, round 2 open
    return engine


def _rewrite(tmp_path: Path, name: str, change) -> None:
    store = CheckpointStore(tmp_path / "state")
    data = store.load(name)
    data = {k: v for k, v in data.items() if k != "format"}
    change(data)
    store.save(name, data)


def test_finished_as_a_string_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "checkpoint", lambda d: d.update(finished="false"))
    try:
        again, _, _ = make_engine(tmp_path, clock)
    except CLEAR as exc:
        assert "finished" in str(exc)
        return
    pytest.fail(f"resumed with finished={again.run.finished!r} from the string 'false'")


def test_nan_global_weights_are_refused(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)

    def poison(d):
        w = d["strategy"]["families"]["f"]["weights"]
        w["w"] = np.full_like(np.asarray(w["w"]), np.nan)
    _rewrite(tmp_path, "checkpoint", poison)
    try:
        again, _, _ = make_engine(tmp_path, clock)
    except CLEAR as exc:
        assert "f" in str(exc)
        return
    pytest.fail(f"resumed with non-finite global weights: {again.strategy.states['f'].weights['w']}")


def test_global_weights_of_another_layout_than_the_pinned_one_are_refused(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)

    def reshape(d):
        d["strategy"]["families"]["f"]["weights"]["w"] = np.zeros((7, 7), np.float32)
    _rewrite(tmp_path, "checkpoint", reshape)
    try:
        again, _, _ = make_engine(tmp_path, clock)
    except CLEAR as exc:
        assert "not laid out as the task pinned" in str(exc)
        return
    pytest.fail(f"resumed with a (7,7) state while the task pins layout {again.parts.task.layouts}")


def test_next_round_not_positive_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "checkpoint", lambda d: d.update(next_round=-5))
    try:
        again, _, _ = make_engine(tmp_path, clock)
    except CLEAR as exc:
        assert "next_round" in str(exc)
        return
    pytest.fail(f"resumed at round {again.run.next_round}")


def test_a_checkpoint_missing_algorithm_fails_clearly(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "checkpoint", lambda d: d.pop("algorithm"))
    with pytest.raises(CLEAR, match="algorithm"):
        make_engine(tmp_path, clock)


def test_open_round_median_claim_of_wrong_type_is_refused_at_start(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "open_round", lambda d: d.update(median_claim="lots"))
    try:
        again, _, _ = make_engine(tmp_path, clock)
    except CLEAR as exc:
        assert "median_claim" in str(exc)
        return
    hello(again, "a"), hello(again, "b")
    send(again, update(again, "a", 2))  # must not crash the coordinator either
    pytest.fail("resumed an open round whose median_claim is a string")


def _expect_clear_start_failure(tmp_path, clock, what, named):  # type: ignore[no-untyped-def]
    try:
        again, _, _ = make_engine(tmp_path, clock)
    except CLEAR as exc:
        assert named in str(exc), exc
        return str(exc)
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"start-up failed with an unclear {type(exc).__name__}: {exc!r} (expected a message naming {what})")
    # it started: run a little, the error must not surface later mid-run
    try:
        hello(again, "a"), hello(again, "b")
        clock.now += 100
        again.tick(), again.tick()
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"started on a bad {what}, then crashed mid-run: {type(exc).__name__}: {exc}")
    pytest.fail(f"started on a bad {what}")


def test_run_id_not_a_string(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "checkpoint", lambda d: d.update(run_id=12345))
    _expect_clear_start_failure(tmp_path, clock, "run_id", "run_id")


def test_last_summary_garbage(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "checkpoint", lambda d: d.update(last_summary={"bogus": 1}))
    _expect_clear_start_failure(tmp_path, clock, "last_summary", "last_summary")


def test_global_weights_of_strings(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "checkpoint", lambda d: d["strategy"]["families"]["f"]["weights"].update(w="zzz"))
    _expect_clear_start_failure(tmp_path, clock, "strategy weights", "f's w")


def test_freshness_epoch_garbage(tmp_path: Path) -> None:
    clock = Clock()
    _two_rounds(tmp_path, clock)
    _rewrite(tmp_path, "freshness", lambda d: d.update(epoch="soon"))
    _expect_clear_start_failure(tmp_path, clock, "freshness epoch", "soon")
