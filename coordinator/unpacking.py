"""Compressed updates are decoded here, before any check or aggregator reads them.

Every strategy and aggregation rule then sees plain float arrays, in the family's layout and
order, exactly as if the agent had sent them uncompressed. The layout is checked before
anything is allocated: a top-k payload of k values declares a shape it would expand to.
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.rejects import RejectedUpdate, RejectReason
from coordinator.strategies.base import FamilyState
from protocol.arrays import layout_of
from protocol.compression import CompressionSpec, check_packed_layout, raw_bytes, unpack_arrays
from protocol.messages import Update


def unpack_update(update: Update, compression: CompressionSpec, states: Mapping[str, FamilyState]) -> Update:
    """``update`` with its packed delta decoded into ``delta``; raises RejectedUpdate or ProtocolError."""
    if not update.packed_delta:
        return update  # uncompressed: always allowed (an agent that cannot compress says so and sends plain)
    kinds = {packed.kind for packed in update.packed_delta.values()}
    if compression.kind == "none" or kinds != {compression.kind}:
        raise RejectedUpdate(RejectReason.COMPRESSION_MISMATCH,
                             f"packed as {', '.join(sorted(kinds))}, the run compresses with {compression}")
    state = states.get(update.family)
    if state is None:
        raise RejectedUpdate(RejectReason.MISSING_PAYLOAD, f"family {update.family} bootstraps: send weights")
    layout = layout_of(state.weights)
    check_packed_layout(update.packed_delta, {n: layout[n] for n in layout if n not in update.delta}, "packed delta")
    unpacked = unpack_arrays(update.packed_delta)
    merged = {**update.delta, **unpacked}
    ordered = {name: merged[name] for name in state.weights if name in merged}  # the family's order: folds agree
    return update.model_copy(update={"delta": ordered, "packed_delta": {}})


def update_raw_bytes(update: Update) -> int:
    """What the update's arrays take uncompressed (after ``unpack_update``)."""
    return sum(raw_bytes(arrays) for arrays in (update.weights, update.delta, update.control_delta))
