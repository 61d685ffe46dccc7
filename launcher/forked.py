"""The launcher's side of ``launcher/forkserver.py``: processes forked from a parent that imported their code once.

``ForkServer.shared(argv, env)`` starts (once per interpreter, command module and import-time environment) the
preloaded parent; ``spawn`` asks it for a child and returns a ``ForkedChild``, which answers what the launcher asks of a
``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``). The child is not the
launcher's own (the fork server is its parent and reaps it), so its exit code arrives as a message on the
child's own socket instead of from ``waitpid``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "NVIDIA")
"""Environment variables read while torch and the agent's code load: children differing in these get their
own fork server (every other variable a child gets from its own environment, set after the fork)."""
PRELOADS: dict[str, tuple[str, ...]] = {
    "edge_agent": ("numpy", "torch", "edge_agent.cli", "edge_agent.bootstrap", "edge_agent.tasks.builtin"),
    "coordinator": ("numpy", "coordinator.app.cli", "coordinator.app.service", "coordinator.sites.service",
                    "coordinator.fleet.enrollment"),
}
"""What a command's process imports before its work, by the module it runs (``python -m <module>``): the fork
server for it imports these once. A child imports anything else itself, as a fresh process does; so the
coordinator's fork server never loads torch, which the coordinator does not use."""
FORK_BY_DEFAULT = sys.platform == "linux"
"""Where the launcher forks its processes unless told otherwise: fork after importing torch is sound on Linux
(the parent starts no thread and no CUDA before it); elsewhere, macOS above all, a fork without exec is not safe
for every library (Apple's frameworks may abort in the child), so each process is a fresh interpreter."""
START_TIMEOUT_S = 180.0
"""For the fork server's imports (a few seconds; a loaded two-core machine stretches them)."""
LOST = 1
"""The exit code a child is given when the fork server died before reporting it (it then got SIGTERM)."""


class ForkServerError(RuntimeError):
    pass


class ForkedChild:
    """A child of the fork server, seen from the launcher like a ``subprocess.Popen``.

    Signals go through a pidfd where the kernel has them (Linux 5.3+): the fork server reaps a child at once, so
    unlike a ``Popen``'s zombie nothing holds its pid between its exit and the launcher hearing of it."""

    def __init__(self, argv: list[str], pid: int, channel: socket.socket, received: bytes = b"") -> None:
        self.args = argv
        self.pid = pid
        self.returncode: int | None = None
        self._channel = channel
        self._buffer = received
        """What arrived after the pid line: the exit code already, for a child that exits at once."""
        self._lock = threading.Lock()
        self._pidfd = _open_pidfd(pid)
        self._server_lost = False

    def poll(self) -> int | None:
        # As Popen.poll: never blocks behind a wait() in another thread; it answers None until that one is done.
        if not self._lock.acquire(blocking=False):
            return self.returncode
        try:
            return self._collect(0.0)
        finally:
            self._lock.release()

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:  # never signal a pid that may already belong to another process
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _collect(self, timeout: float | None) -> int | None:
        """The exit code once the fork server has sent it, waiting up to ``timeout`` (None: for ever).
        The caller holds ``_lock``."""
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer and not self._server_lost:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._channel], [], [], left)[0]:
                return None
            chunk = self._channel.recv(4096)
            if chunk:
                self._buffer += chunk
            else:  # the fork server died: its children got SIGTERM (parent-death signal)
                self._server_lost = True
        if b"\n" in self._buffer:
            self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["returncode"])
        elif self._pidfd is None or select.select([self._pidfd], [], [],
                                                   None if deadline is None else
                                                   max(0.0, deadline - time.monotonic()))[0]:
            self.returncode = LOST  # gone, its exit code with the server; without a pidfd, assumed gone
        else:
            return None  # still shutting down (or stopped, its SIGTERM pending)
        self._close()
        return self.returncode

    def _close(self) -> None:
        self._channel.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds (old kernel, not Linux), or the child is gone already
        return None


class ForkServer:
    """One preloaded parent process (``python -m launcher.forkserver``) and the socket that asks it for children."""

    _shared: dict[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], ForkServer] = {}
    _shared_lock = threading.Lock()

    def __init__(self, python: str, env: Mapping[str, str], preload: tuple[str, ...]) -> None:
        self.python = python
        self.preload = preload
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()
        with theirs:
            self._process = subprocess.Popen(
                [python, "-m", "launcher.forkserver", str(theirs.fileno()), *preload], pass_fds=[theirs.fileno()],
                env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)  # no parent-death signal: it stops when the control socket closes
        self._control.settimeout(START_TIMEOUT_S)
        try:
            answer = self._control.recv(4096)
        except TimeoutError as exc:
            self.close()
            raise ForkServerError(f"the fork server did not load within {START_TIMEOUT_S:.0f} s") from exc
        self._control.settimeout(None)
        if answer != b"ready":
            self.close()
            raise ForkServerError(answer.decode(errors="replace") or "the fork server exited while loading")

    @classmethod
    def shared(cls, argv: list[str], env: Mapping[str, str]) -> ForkServer:
        """The fork server for ``argv``'s interpreter, module and import-time environment, started on first use."""
        if len(argv) < 3 or argv[1] != "-m" or argv[2] not in PRELOADS:
            raise ForkServerError(f"no fork server runs {argv[:3]}: only python -m {' or '.join(PRELOADS)}")
        python, preload = argv[0], PRELOADS[argv[2]]
        key = (python, preload, tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES))))
        with cls._shared_lock:
            server = cls._shared.get(key)
            if server is None or not server.alive:
                if server is not None:
                    server.close()  # reaps it and closes its socket
                server = cls._shared[key] = cls(python, env, preload)
            return server

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def spawn(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> ForkedChild:
        """Start ``argv`` (``[python, "-m", module, *args]``) as a forked child logging to ``log_path``."""
        if argv[0] != self.python:
            raise ForkServerError(f"this fork server runs {self.python}, not {argv[0]}")
        ours, theirs = socket.socketpair()
        try:
            with theirs, self._lock:
                socket.send_fds(self._control, [b"f"], [theirs.fileno()])
            # An absolute log path: the child opens it after moving to cwd, but an error there has no log to go to.
            request = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": os.getcwd(),
                       "log_path": str(Path(log_path).absolute())}
            ours.sendall(json.dumps(request).encode() + b"\n")
            reply, rest = _read_reply(ours)
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"the fork server is gone: {exc}") from exc
        if "pid" not in reply:
            ours.close()
            raise ForkServerError(reply.get("error", f"unexpected answer {reply}"))
        return ForkedChild(argv, int(reply["pid"]), ours, rest)

    def close(self) -> None:
        """Stop the server (its remaining children get SIGTERM)."""
        self._control.close()
        try:
            self._process.wait(10.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    @classmethod
    def close_shared(cls) -> None:
        with cls._shared_lock:
            servers = list(cls._shared.values())
            cls._shared.clear()
        for server in servers:
            server.close()


def _read_reply(channel: socket.socket, timeout_s: float = 60.0) -> tuple[dict[str, Any], bytes]:
    """The server's first line, and whatever came after it (a child that exited at once: its exit code)."""
    channel.settimeout(timeout_s)
    data = b""
    try:
        while b"\n" not in data:
            chunk = channel.recv(4096)
            if not chunk:
                return {"error": "the fork server closed the child's socket before answering"}, b""
            data += chunk
    except TimeoutError:
        return {"error": f"no answer from the fork server within {timeout_s:.0f} s"}, b""
    finally:
        channel.settimeout(None)
    line, rest = data.split(b"\n", 1)
    answer: dict[str, Any] = json.loads(line)
    return answer, rest


atexit.register(ForkServer.close_shared)
