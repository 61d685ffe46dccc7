"""Compressed updates are decoded here, before any check or aggregator reads them.

Every strategy and aggregation rule then sees plain float arrays, in the family's layout and
order, exactly as if the agent had sent them uncompressed. The layout is checked before
anything is allocated: a top-k payload of k values declares a shape it would expand to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from coordinator.admission.decisions import Reject
from coordinator.aggregation.running_mean import with_norm
from coordinator.reasons import RejectReason
from protocol.arrays import layout_of
from protocol.compression import CompressionSpec, PackedArray, check_packed_layout, raw_bytes, unpack_arrays
from protocol.messages import Update


class StateArrays(Protocol):
    """A family's global state as far as unpacking needs it: the arrays a delta applies to."""

    weights: dict[str, np.ndarray]
    control: dict[str, np.ndarray]


def unpack_update(update: Update, compression: CompressionSpec,
                  states: Mapping[str, StateArrays]) -> Update | Reject:
    """``update`` with its packed delta (and control delta) decoded into plain arrays, or why it
    cannot be; a payload that breaks the wire's own rules raises ProtocolError, as decoding does."""
    if not update.packed_delta and not update.packed_control_delta:
        return update  # uncompressed: always allowed (an agent that cannot compress says so and sends plain)
    kinds = {packed.kind for packed in (*update.packed_delta.values(), *update.packed_control_delta.values())}
    if compression.kind == "none" or kinds != {compression.kind}:
        return Reject(RejectReason.COMPRESSION_MISMATCH,
                      f"packed as {', '.join(sorted(kinds))}, the run compresses with {compression}")
    state = states.get(update.family)
    if state is None:
        return Reject(RejectReason.MISSING_PAYLOAD, f"family {update.family} bootstraps: send weights")
    delta = _unpacked(update.delta, update.packed_delta, state.weights, "packed delta")
    control = _unpacked(update.control_delta, update.packed_control_delta, state.control, "packed control delta")
    return update.model_copy(update={"delta": with_norm(delta), "packed_delta": {},
                                     "control_delta": with_norm(control) if control else control,
                                     "packed_control_delta": {}})


def _unpacked(plain: Mapping[str, np.ndarray], packed: Mapping[str, PackedArray], reference: Mapping[str, np.ndarray],
              what: str) -> dict[str, np.ndarray]:
    """``plain`` and ``packed`` as one dict of plain arrays in ``reference``'s order (folds agree);
    the layout is checked against ``reference`` before anything is allocated."""
    if not packed:
        return dict(plain)
    layout = layout_of(reference)
    check_packed_layout(packed, {n: layout[n] for n in layout if n not in plain}, what)
    merged = {**plain, **unpack_arrays(packed)}
    ordered = {name: merged[name] for name in reference if name in merged}
    return {**ordered, **merged}  # a name outside the reference stays, for the layout check to reject


def update_raw_bytes(update: Update) -> int:
    """What the update's arrays take uncompressed (after ``unpack_update``)."""
    return sum(raw_bytes(arrays) for arrays in (update.weights, update.delta, update.control_delta))
