"""Two coordinators on one state directory would overwrite each other's checkpoint and rounds log: the second one
stops before it reads or writes anything there (its signing key included), naming the directory; the claim ends
with the run. A directory that cannot be written is named with what to fix, not as a bare ``PermissionError`` on a
lock file; and two processes creating the signing key at once end up with one key."""

from __future__ import annotations

import errno
import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from coordinator.app.cli import app
from coordinator.app.service import CoordinatorService
from coordinator.settings import CoordinatorSettings
from service_kit.keys import load_or_create_signing_key
from service_kit.state_claim import StateDirClaim, StateDirInUse, StateDirUnusable


def settings_in(state: Path) -> CoordinatorSettings:
    return CoordinatorSettings(federation="t", state_dir=state, rounds=1, http_port=0)


def test_a_second_coordinator_on_a_state_dir_in_use_stops_before_writing_anything(tmp_path: Path) -> None:
    held = StateDirClaim(tmp_path / "state", "coordinator")  # what the first coordinator holds
    with pytest.raises(StateDirInUse, match=r"state_dir .*state is in use by another coordinator process"):
        CoordinatorService(settings_in(tmp_path / "state"), CollectorRegistry())
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [".lock"]  # no key, no checkpoint
    held.release()
    service = CoordinatorService(settings_in(tmp_path / "state"), CollectorRegistry())  # free once its holder lets go
    with pytest.raises(StateDirInUse):  # and now this one holds it, until its run ends
        StateDirClaim(tmp_path / "state", "coordinator")
    stop = threading.Event()
    stop.set()  # the run ends at once
    service.run(stop)
    StateDirClaim(tmp_path / "state", "coordinator").release()


def test_the_command_says_the_state_dir_is_in_use_in_one_line(tmp_path: Path) -> None:
    held = StateDirClaim(tmp_path / "state", "coordinator")
    result = CliRunner().invoke(app, ["run", "--state-dir", str(tmp_path / "state"), "--federation", "t"])
    held.release()
    assert result.exit_code == 2, result.output
    assert "error: cannot start: state_dir" in result.output and "is in use by another coordinator" in result.output
    assert "Traceback" not in result.output


def test_a_state_dir_that_cannot_be_written_is_named_with_what_to_fix(tmp_path: Path) -> None:
    (tmp_path / "volume").write_text("a file where the directory should be")  # root writes anywhere: not chmod
    with pytest.raises(StateDirUnusable, match=r"state_dir .*volume/state cannot be written .*give it a directory"):
        CoordinatorService(settings_in(tmp_path / "volume" / "state"), CollectorRegistry())
    assert isinstance(StateDirUnusable("x"), ValueError)  # the agent's and coordinator's commands print it as one line


def test_processes_creating_the_signing_key_at_once_end_up_with_one_key(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "coordinator_key.pem"
    for _ in range(20):
        path.unlink(missing_ok=True)
        with ThreadPoolExecutor(max_workers=8) as pool:
            keys = list(pool.map(lambda _: load_or_create_signing_key(path).public_key.key_id, range(8)))
        assert set(keys) == {load_or_create_signing_key(path).public_key.key_id}, keys
        assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # nothing left aside


def test_a_service_that_will_not_run_lets_its_state_dir_go_when_closed(tmp_path: Path) -> None:
    """launcher/inprocess builds the service, then the agents: when an agent cannot be built the service is closed,
    and the directory (and its port) is free at once, not at the next garbage collection (found in review)."""
    CoordinatorService(settings_in(tmp_path / "state"), CollectorRegistry()).close()
    CoordinatorService(settings_in(tmp_path / "state"), CollectorRegistry()).close()


def test_the_command_does_not_hide_a_bug_behind_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what the operator fixes (a directory in use or unwritable) is printed as one line; any other error at
    construction keeps its traceback (found in review: every ValueError was reduced to a line)."""
    import coordinator.app.service as service_module

    def buggy(settings: CoordinatorSettings) -> None:
        raise ValueError("invalid literal for int() with base 10: 'x'")

    monkeypatch.setattr(service_module, "build_strategy", buggy)
    result = CliRunner().invoke(app, ["run", "--state-dir", str(tmp_path / "state"), "--federation", "t"])
    assert isinstance(result.exception, ValueError) and "cannot start" not in result.output


def test_a_key_whose_copy_aside_is_removed_before_it_is_linked_is_written_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator starting on the directory removes torn writes (``.*.tmp``) while ``coordinator enroll`` creates
    the key there: the key's copy aside vanishes between its write and its link (found in review)."""
    from service_kit import durable

    real_fsync, removed = os.fsync, []

    def fsync_then_a_coordinator_starts(fd: int) -> None:
        real_fsync(fd)
        if not removed:
            removed.extend(durable.remove_torn_writes(tmp_path))

    monkeypatch.setattr(durable.os, "fsync", fsync_then_a_coordinator_starts)
    key = load_or_create_signing_key(tmp_path / "coordinator_key.pem")
    assert removed and key.public_key.key_id == load_or_create_signing_key(tmp_path / "coordinator_key.pem").public_key.key_id


def test_without_hard_links_the_key_is_created_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service_kit import durable

    def no_links(source: object, target: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(durable.os, "link", no_links)
    key = load_or_create_signing_key(tmp_path / "coordinator_key.pem")
    assert key.public_key.key_id == load_or_create_signing_key(tmp_path / "coordinator_key.pem").public_key.key_id
    assert oct((tmp_path / "coordinator_key.pem").stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir()] == ["coordinator_key.pem"]


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_claim_that_failed_to_build_is_collected_quietly() -> None:
    with pytest.raises(TypeError):
        StateDirClaim("not a path")  # type: ignore[arg-type]
    gc.collect()
