"""Atomic file replacement: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, fsync it, rename over ``path``, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def create_exclusive_bytes(path: Path, data: bytes, mode: int = 0o600) -> bool:
    """Create ``path`` holding ``data`` unless it exists; whether this call created it. The file appears whole
    (written aside, then hard-linked into place, which fails if the name is taken), so of two processes
    creating the same file at once exactly one wins and the other reads the winner's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp_name, path)
        except FileExistsError:
            return False
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    _fsync_directory(path.parent)
    return True


def _fsync_directory(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_torn_writes(directory: Path) -> list[Path]:
    """Delete what ``atomic_write_bytes`` left in ``directory`` when its process was killed mid-write (SIGKILL runs
    no except clause): each a partial copy, as large as a checkpoint, that nothing else would ever remove. Call it
    at start-up, before this process writes there; the files removed."""
    if not directory.is_dir():
        return []
    torn = sorted(p for p in directory.glob(".*.tmp") if p.is_file())
    for path in torn:
        path.unlink(missing_ok=True)
    return torn
