"""A parent that imports the edge agent's libraries once and forks agent processes from itself.

Started as ``python -m launcher.forkserver <fd> <module>...`` by ``launcher.forked.ForkServer``, which holds the
other end of the control socket ``<fd>``; it imports the modules named, then serves. Starting an agent the usual way (``python -m edge_agent run``) spends about
3 CPU seconds importing torch, numpy, pydantic and the agent's own code before it does anything: for a fleet of
ten on a two-core machine, some fifteen seconds of wall time. Here that is paid once; each agent is a ``fork``
of this process, then runs ``edge_agent`` as ``python -m`` would. It is still a process of its own: its own pid,
session, environment (with whatever the preloaded imports set, as a fresh process importing them would have),
working directory, log file, broker connection and state directory; SIGSTOP, SIGKILL and
SIGTERM reach it as they would a fresh one; its exit code comes back to the launcher.

Protocol, per child: the launcher passes one end of a fresh socket pair over the control socket; on it, the
launcher writes one JSON line (``argv`` as ``[python, "-m", module, *args]``, ``env``, ``cwd``, ``log_path``), and
this process answers ``{"pid": N}`` (or ``{"error": ...}``), then, once the child has exited,
``{"returncode": R}`` (negative: killed by signal -R, as ``subprocess`` reports it). The control socket's end
(the launcher closed it or died) stops this process; its children then get SIGTERM (parent-death signal).

Safe to fork because this process runs no threads and never initialises torch's thread pools or CUDA: it only
imports. A child reseeds numpy's and torch's global generators, as a fresh process would start them unseeded.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any

from launcher.lifeline import die_with_parent, name_process


@dataclass(frozen=True)
class ChildRequest:
    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    log_path: str

    @classmethod
    def parse(cls, line: bytes) -> ChildRequest:
        fields: dict[str, Any] = json.loads(line)
        argv = fields["argv"]
        if len(argv) < 3 or argv[1] != "-m":
            raise ValueError(f"the fork server runs `python -m <module> ...` commands only, not {argv[:3]}")
        return cls(argv[2], [str(a) for a in argv[3:]], {str(k): str(v) for k, v in fields["env"].items()},
                   str(fields["cwd"]), str(fields["log_path"]))


def send_line(channel: socket.socket, message: dict[str, Any]) -> None:
    try:
        channel.sendall(json.dumps(message).encode() + b"\n")
    except OSError:  # the launcher closed its end: it no longer asks after this child
        pass


def read_line(channel: socket.socket, limit: int = 1 << 20) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = channel.recv(65536)
        if not chunk or len(data) > limit:
            raise ValueError("the launcher's request ended early or ran over 1 MiB")
        data += chunk
    return data


class Server:
    """The accept-fork-reap loop; ``serve`` returns only in a forked child, with what it is to run."""

    def __init__(self, control: socket.socket, import_env: dict[str, str]) -> None:
        self.control = control
        self.import_env = import_env
        """Variables the preloaded imports set: a fresh process would have them too, whatever its environment."""
        self.children: dict[int, socket.socket] = {}
        self.wake_read, self.wake_write = socket.socketpair()
        for end in (self.wake_read, self.wake_write):
            end.setblocking(False)
        self.selector = selectors.DefaultSelector()

    def serve(self) -> ChildRequest | None:
        # SIGCHLD only wakes the loop (a byte on the wake socket); reaping happens in the loop, never in a handler.
        signal.set_wakeup_fd(self.wake_write.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(self.control, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.wake_read:
                    self._drain_wake()
                    self._reap()
                    continue
                try:
                    message, fds, _, _ = socket.recv_fds(self.control, 16, 1)
                except OSError:  # e.g. out of file descriptors: that start fails (the launcher times out), not all
                    continue
                if not message:
                    return None  # the launcher is gone
                if not fds:
                    continue
                request = self._fork(socket.socket(fileno=fds[0]))
                if request is not None:
                    return request

    def _fork(self, channel: socket.socket) -> ChildRequest | None:
        channel.settimeout(30.0)  # a launcher that died between passing the socket and writing must not hang us
        try:
            request = ChildRequest.parse(read_line(channel))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            send_line(channel, {"error": f"bad request: {exc}"})
            channel.close()
            return None
        channel.settimeout(None)
        request.env.update(self.import_env)
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # nothing of ours may turn up in the child's log
            stream.flush()
        try:
            pid = os.fork()
        except OSError as exc:  # out of processes or memory: this start fails, the running children go on
            send_line(channel, {"error": f"cannot fork: {exc}"})
            channel.close()
            return None
        if pid == 0:
            self._become_child(channel)
            die_with_parent()
            if os.getppid() != parent:  # the server died before the parent-death signal was armed
                os._exit(1)
            return request
        self.children[pid] = channel
        send_line(channel, {"pid": pid})
        return None

    def _become_child(self, own_channel: socket.socket) -> None:
        """Drop everything of the server's: sockets, the SIGCHLD wake-up, the other children's channels."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        for sock in (self.control, self.wake_read, self.wake_write, own_channel, *self.children.values()):
            sock.close()
        self.children.clear()

    def _drain_wake(self) -> None:
        try:
            while self.wake_read.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            channel = self.children.pop(pid, None)
            if channel is not None:
                send_line(channel, {"returncode": os.waitstatus_to_exitcode(status)})
                channel.close()


def run_child(request: ChildRequest) -> None:
    """Become ``python -m <module> <args>`` in the request's directory, environment and log file."""
    os.setsid()  # its own session, as the launcher's fresh processes: a terminal's Ctrl-C reaches only the launcher
    name_process(request.module.replace("_", "-"))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    devnull = os.open(os.devnull, os.O_RDONLY)
    log = os.open(request.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    _reseed_generators()
    sys.path[0] = request.cwd  # where ``python -m`` would look first
    sys.argv = [request.module, *request.args]
    runpy.run_module(request.module, run_name="__main__", alter_sys=True)


def _reseed_generators() -> None:
    """Fresh entropy for the global generators a new process would start unseeded (Python's ``random`` reseeds
    itself at fork); only for libraries already loaded, so a child loads nothing it would not have."""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops it by closing the control socket
    before = dict(os.environ)
    try:
        for name in argv[2:]:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 -- reported to the launcher, which fails the start with it
        control.send(f"error: preloading failed: {type(exc).__name__}: {exc}".encode())
        raise SystemExit(1) from exc
    control.send(b"ready")
    request = Server(control, {k: v for k, v in os.environ.items() if before.get(k) != v}).serve()
    if request is not None:
        run_child(request)


if __name__ == "__main__":
    main(sys.argv)
