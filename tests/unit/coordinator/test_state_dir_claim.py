"""Two coordinators on one state directory would overwrite each other's checkpoint and rounds log: the second one
stops before it reads or writes anything there (its signing key included), naming the directory; the claim ends
with the run. A directory that cannot be written is named with what to fix, not as a bare ``PermissionError`` on a
lock file; and two processes creating the signing key at once end up with one key."""

from __future__ import annotations

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
