"""Children that do not outlive the process that started them (Linux's parent-death signal), and their names."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies, so no agent outlives a crashed demo (Linux only)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def name_process(name: str) -> None:
    """The name ``top`` and ``ps -o comm`` show (Linux, 15 bytes at most): a forked agent's command line is its
    parent's (``python -m launcher.forkserver ...``), so this is where an operator sees ``edge-agent``."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass
