"""Why a set of updates could not be aggregated: a bounded set of reasons, counted by the engine."""

from __future__ import annotations

from enum import Enum


class FailureReason(str, Enum):
    NO_UPDATES = "no_updates"
    """Nothing to aggregate (or every update had weight zero)."""
    BAD_WEIGHTS = "bad_weights"
    """Weights not one per update, negative, non-finite, or all zero."""
    LAYOUT_MISMATCH = "layout_mismatch"
    """Updates do not share one set of names, shapes and dtypes."""
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    """An array whose values no rule here can combine (complex)."""
    TOO_FEW_UPDATES = "too_few_updates"
    """Fewer updates than the rule needs to tolerate the configured number of Byzantine agents."""
    NON_FINITE_RESULT = "non_finite_result"
    """The next global state overflowed to inf (e.g. finite but huge deltas added to the weights)."""
    INVALID_PARAMETER = "invalid_parameter"
    """A rule's parameter is out of its range (f < 0, beta outside [0, 1/2), m < 1, clip norm <= 0)."""


class AggregationError(ValueError):
    """The inputs cannot be aggregated as configured; the round fails with ``reason``.

    ``reason`` is one of :class:`FailureReason`'s values (a bounded metric label);
    ``detail`` says what exactly was wrong, for the log and the round summary.
    """

    def __init__(self, reason: str | FailureReason, detail: str) -> None:
        reason = FailureReason(reason).value
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
