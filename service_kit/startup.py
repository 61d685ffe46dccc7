"""Why a service cannot start, when the operator is the one to fix it (a file, a port, a directory)."""

from __future__ import annotations


class CannotStart(Exception):
    """Printed by the command as one line naming what to fix (exit 2), not as a traceback: a bug still shows its
    traceback, since only this is caught."""
