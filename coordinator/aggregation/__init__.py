"""Aggregation as pure numpy functions over named arrays, shared by every strategy.

Every rule has the signature ``rule(updates, weights, *, <its parameters>) -> {name: array}``:
``updates`` is a sequence of ``{name: array}`` with one layout (names, shapes, dtypes),
``weights`` one non-negative weight per update (sample counts). The result has the inputs'
names, shapes and dtypes; floating values are computed in float64 and rounded once.

| rule                | floating arrays                                    | uses the weights      |
|---------------------|----------------------------------------------------|-----------------------|
| ``weighted_mean``   | sum w_i x_i / sum w_i                              | yes                   |
| ``coordinate_median`` | per-coordinate median (mean of the middle two)   | only to drop w = 0    |
| ``trimmed_mean``    | per coordinate, mean without the k = floor(beta n) smallest and largest | only to drop w = 0 |
| ``krum``            | the update with the lowest Krum score              | only to drop w = 0    |
| ``multi_krum``      | plain mean of the m lowest-scored updates          | only to drop w = 0    |
| ``geometric_median`` | argmin_z sum_i L2(z - x_i), by smoothed Weiszfeld | only to drop w = 0    |

Robust rules ignore sample weights on purpose: agents report them, so a Byzantine agent
could claim any weight. Integer and boolean arrays are never averaged (see each rule).
Every rule takes ``clip_norm``: each update is first scaled to an L2 norm of at most that
(over its floating values) - for updates (deltas) only, never for absolute weights.

Failures raise :class:`AggregationError` with a ``reason`` from :class:`FailureReason`
(``too_few_updates`` when n is too small for the configured f, ``invalid_parameter``,
``bad_weights``, ``layout_mismatch``, ``no_updates``, ``unsupported_dtype``). The round
engine turns one into a failed round, counted by reason; no rule falls back to averaging.
Inputs must be finite (the coordinator rejects non-finite updates on receipt).

``registry.py`` lists the rules a coordinator can be configured with (``RULES``).
"""

from coordinator.aggregation.coordinate import coordinate_median, trimmed_mean
from coordinator.aggregation.errors import AggregationError, FailureReason
from coordinator.aggregation.krum import krum, krum_scores, multi_krum, pairwise_squared_distances
from coordinator.aggregation.mean import weighted_mean
from coordinator.aggregation.stack import NamedArrays, UpdateStack

__all__ = [
    "AggregationError", "FailureReason", "NamedArrays", "UpdateStack", "coordinate_median", "krum", "krum_scores",
    "multi_krum", "pairwise_squared_distances", "trimmed_mean", "weighted_mean",
]
