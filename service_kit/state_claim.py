"""An exclusive hold on a state directory, for as long as the process lives or until ``release``.

Two processes on one state directory each save their own view of what it holds (an agent's privacy ledger and
variates, a coordinator's checkpoint and rounds log), and the last write erases the other's. ``flock`` is per open
file, so a second claim fails in the same process too, and the kernel lets go when the process dies (no stale lock
after a crash)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from service_kit.startup import CannotStart

LOCK_FILE = ".lock"


class StateDirInUse(CannotStart, ValueError):
    """Another process (or another open claim) holds this state directory."""


class StateDirUnusable(CannotStart, ValueError):
    """The state directory cannot be created or written (permissions, a read-only volume)."""


class StateDirClaim:
    _fd: int | None = None  # set before anything can fail: ``__del__`` runs on a half-built claim too

    def __init__(self, root: Path, holder: str = "agent",
                 why: str = "two agents sharing one would overwrite each other's privacy budget and state") -> None:
        path = root / LOCK_FILE
        try:
            root.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a bare PermissionError would name only the lock file, not what to fix
            raise StateDirUnusable(f"state_dir {root} cannot be written ({exc.strerror or exc}: {path}); the {holder} "
                                   f"keeps its state there: give it a directory it can write (in Kubernetes, a "
                                   f"writable volume owned by the pod's user)") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise StateDirInUse(f"state_dir {root} is in use by another {holder} process (it holds {path}); "
                                f"{why}") from None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:  # a claim dropped unreleased (a service built but never run) lets go with it
        self.release()
