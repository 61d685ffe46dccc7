"""Atomic file replacement: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import errno
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
    creating the same file at once exactly one wins and the other reads the winner's. A copy aside removed
    meanwhile (a starting coordinator's ``remove_torn_writes``) is written again; where hard links are not
    supported, the file is created exclusively in place instead (a reader racing the write may see it short)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            try:
                os.fchmod(fd, mode)
                _write_synced(fd, data)
            finally:
                os.close(fd)
            os.link(tmp_name, path)
        except FileExistsError:
            return False
        except FileNotFoundError:  # the copy aside was removed before it was linked: write it again
            continue
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            return _create_in_place(path, data, mode)  # a filesystem without hard links
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        _fsync_directory(path.parent)
        return True
    raise FileNotFoundError(f"{path}: its copy aside kept disappearing before it was linked into place")


def _create_in_place(path: Path, data: bytes, mode: int) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    try:
        _write_synced(fd, data)
    finally:
        os.close(fd)
    _fsync_directory(path.parent)
    return True


def _write_synced(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


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
