"""The two ways a secure-aggregation step says no.

``SecAggRefused``: one message is not accepted (wrong stage, unknown sender, a second copy, a late
upload, bad shape); the state is unchanged and the round goes on. The wiring drops it and counts it.

``SecAggAborted``: the round cannot finish without giving something away or returning a wrong sum
(too few survivors or shares for the threshold, a share that does not open, an inconsistent
request); it fails with this reason and the sum is never released.
"""

from __future__ import annotations


class SecAggRefused(ValueError):
    """One message refused; the protocol state is unchanged."""


class SecAggAborted(RuntimeError):
    """The round fails at ``stage`` for ``reason``; no sum (nor part of one) is released."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"secure aggregation aborted at {stage}: {reason}")
        self.stage = stage
        self.reason = reason
