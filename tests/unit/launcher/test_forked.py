"""The fork server's children are processes of their own: pid, session, environment, log, signals, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.fleet import ManagedProcess
from launcher.forked import LOST, PRELOADS, ForkedChild, ForkServer, ForkServerError, _read_reply

CHILD = [sys.executable, "-m", "forked_child"]
"""Found as ``python -m`` finds a module: in the working directory, where ``in_child_dir`` puts a copy."""


@pytest.fixture(autouse=True)
def in_child_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(Path(__file__).with_name("forked_child.py"), tmp_path / "forked_child.py")
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    started = ForkServer(sys.executable, os.environ, PRELOADS["edge_agent"])
    yield started
    started.close()


def report(log: Path) -> dict[str, object]:
    line = next(line for line in log.read_text().splitlines() if line.startswith("{"))
    fields: dict[str, object] = json.loads(line)
    return fields


def wait_for_report(log: Path, timeout_s: float = 60.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "{" in log.read_text():
            return report(log)
        time.sleep(0.05)
    raise AssertionError(f"no report in {log}")


def state(pid: int) -> str:
    """The process's state letter (R, S, T, Z...), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def wait_until_stopped(pid: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while state(pid) != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)


def test_a_child_runs_the_module_in_its_own_session_directory_environment_and_log(
        server: ForkServer, tmp_path: Path) -> None:
    env = {**os.environ, "FORKED_CHILD_MARKER": "seen"}
    children = [server.spawn([*CHILD, "3", f"arg-{i}"], env, tmp_path / f"child-{i}.log") for i in range(2)]
    assert [child.wait(60) for child in children] == [3, 3]
    first, second = (report(tmp_path / f"child-{i}.log") for i in range(2))
    assert first["pid"] == children[0].pid and first["sid"] == children[0].pid  # its own session
    assert first["cwd"] == str(tmp_path) and first["marker"] == "seen"  # the module was found there, too
    assert first["argv"] == ["3", "arg-0"] and second["argv"] == ["3", "arg-1"]
    assert first["torch_loaded"] is True  # imported before the fork, not by the child
    assert first["comm"] == "forked-child"  # what top shows: the module's name, not the parent's python
    assert first["draw"] != second["draw"]  # numpy reseeded in each child, not the parent's state twice


def test_signals_reach_the_child_and_its_exit_code_comes_back(server: ForkServer, tmp_path: Path) -> None:
    child = server.spawn([*CHILD, "0", "wait"], dict(os.environ), tmp_path / "child.log")
    wait_for_report(tmp_path / "child.log")
    os.kill(child.pid, signal.SIGSTOP)
    assert child.poll() is None
    os.kill(child.pid, signal.SIGCONT)
    child.terminate()
    assert child.wait(60) == -signal.SIGTERM
    child.kill()  # after its exit: nothing is signalled


def test_an_exception_in_the_child_is_its_exit_code_1_with_the_traceback_in_its_log(
        server: ForkServer, tmp_path: Path) -> None:
    child = server.spawn([*CHILD, "0", "raise"], dict(os.environ), tmp_path / "child.log")
    assert child.wait(60) == 1
    assert "RuntimeError: planted failure" in (tmp_path / "child.log").read_text()


def test_only_python_dash_m_commands_of_the_server_s_own_interpreter_are_run(
        server: ForkServer, tmp_path: Path) -> None:
    with pytest.raises(ForkServerError, match="python -m"):
        server.spawn([sys.executable, "-c", "print(1)"], dict(os.environ), tmp_path / "child.log")
    with pytest.raises(ForkServerError, match="runs"):
        server.spawn(["/usr/bin/python-other", "-m", "json.tool"], dict(os.environ), tmp_path / "child.log")


def test_a_managed_process_runs_agents_and_coordinators_forked_and_starts_again(tmp_path: Path) -> None:
    for module in ("edge_agent", "coordinator"):
        process = ManagedProcess(module, [sys.executable, "-m", module, "--help"], tmp_path / f"{module}.log",
                                 forked=True)
        assert process.start().wait(60) == 0
        assert process.start().wait(60) == 0 and process.starts == 2
        assert (tmp_path / f"{module}.log").read_text().count("Usage:") == 2
    with pytest.raises(ForkServerError, match="only python -m"):
        ManagedProcess("child", [*CHILD, "0"], tmp_path / "child.log", forked=True).start()


def test_the_coordinator_s_fork_server_does_not_load_torch(tmp_path: Path) -> None:
    server = ForkServer(sys.executable, os.environ, PRELOADS["coordinator"])
    try:
        child = server.spawn([*CHILD, "0"], dict(os.environ), tmp_path / "child.log")
        assert child.wait(60) == 0
        assert report(tmp_path / "child.log")["torch_loaded"] is False
    finally:
        server.close()


def test_variables_the_preloaded_imports_set_survive_the_child_s_own_environment(tmp_path: Path) -> None:
    (tmp_path / "sets_env.py").write_text("import os\nos.environ['SET_AT_IMPORT'] = 'yes'\n")
    server = ForkServer(sys.executable, os.environ, ("sets_env",))  # found in the working directory, as -m would
    try:
        child = server.spawn([*CHILD, "0"], {**os.environ, "SET_AT_IMPORT": "no"}, tmp_path / "child.log")
        assert child.wait(60) == 0
        assert report(tmp_path / "child.log")["set_at_import"] == "yes"  # as in a fresh process importing it
    finally:
        server.close()


def test_when_the_server_stops_its_children_get_sigterm_and_are_reported_lost_once_gone(tmp_path: Path) -> None:
    own = ForkServer(sys.executable, os.environ, ("numpy",))
    running = own.spawn([*CHILD, "0", "wait"], dict(os.environ), tmp_path / "running.log")
    stopped = own.spawn([*CHILD, "0", "wait"], dict(os.environ), tmp_path / "stopped.log")
    for log in ("running.log", "stopped.log"):
        wait_for_report(tmp_path / log)
    os.kill(stopped.pid, signal.SIGSTOP)
    wait_until_stopped(stopped.pid)  # stopped before its SIGTERM comes, which it would otherwise take first
    own.close()
    assert running.wait(60) == LOST  # the parent-death signal ended it
    assert state(running.pid) in ("gone", "Z")  # exited (a zombie until whoever adopted it reaps it)
    # A stopped child holds its SIGTERM until it runs again: still there, so still signalled and not reported gone.
    with pytest.raises(subprocess.TimeoutExpired):
        stopped.wait(0.2)
    assert state(stopped.pid) == "T" and stopped.poll() is None
    stopped.kill()
    assert stopped.wait(60) == LOST


def test_an_exit_code_that_arrives_with_the_pid_is_not_lost() -> None:
    """A child that exits at once: the server's two lines (pid, exit code) can come in one read."""
    ours, theirs = socket.socketpair()
    with theirs:
        theirs.sendall(b'{"pid": %d}\n{"returncode": 3}\n' % os.getpid())
        reply, rest = _read_reply(ours)
    assert reply == {"pid": os.getpid()}
    assert ForkedChild(["x"], reply["pid"], ours, rest).poll() == 3
