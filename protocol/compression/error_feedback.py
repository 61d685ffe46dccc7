"""Error feedback for lossy update compression (re-exported by :mod:`protocol.compression`). Pure numpy."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from protocol.arrays import Layout, all_finite
from protocol.compression.packing import PackedArray, pack_arrays, unpack_arrays
from protocol.compression.spec import CompressionSpec


class ErrorFeedback:
    """Residual memory: what compression dropped is added to the next update, so it is sent later.

    Top-k alone sends the same few large coordinates every round and drops the small ones every
    time: the aggregate is biased towards a few coordinates and training stalls. With error
    feedback the residual (compensated update minus what was actually sent) is added to the next
    update, so every coordinate's mass goes out eventually: the cumulative sent update tracks the
    cumulative true one within a bounded residual. Harmless, though not needed, with unbiased int8.

    Per round: ``c = ef.compensate(delta); packed = pack_arrays(c, spec, rng);
    ef.remember(unpack_arrays(packed), c)`` (or ``ef.pack(delta, spec, rng)``), then save
    :meth:`state_dict` with the agent's state so that a restart keeps the residual.
    """

    def __init__(self) -> None:
        self._residual: dict[str, np.ndarray] = {}

    def compensate(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``arrays`` plus the residual of each (new arrays; those without a residual as they are)."""
        out: dict[str, np.ndarray] = {}
        for name, array in arrays.items():
            residual = self._residual.get(name)
            if residual is not None and (residual.shape != array.shape or residual.dtype != array.dtype):
                raise ValueError(f"{name}: residual is {residual.dtype}{list(residual.shape)}, "
                                 f"the array {array.dtype}{list(array.shape)}; reset() after a layout change")
            out[name] = array if residual is None else array + residual
        return out

    def remember(self, sent_dense: Mapping[str, np.ndarray], compensated: Mapping[str, np.ndarray]) -> None:
        """Keep residual = compensated - sent, per name of ``compensated``, where ``sent_dense`` is the
        decoded form of what was sent (``unpack_arrays(packed)``)."""
        residual: dict[str, np.ndarray] = {}
        for name, array in compensated.items():
            sent = sent_dense.get(name)
            if sent is None or sent.shape != array.shape:
                raise ValueError(f"{name}: what was sent does not match the compensated array")
            residual[name] = (array - sent).astype(array.dtype, copy=False)
        self._residual.update(residual)

    def pack(self, arrays: Mapping[str, np.ndarray], spec: CompressionSpec | str,
             rng: np.random.Generator | None = None) -> dict[str, PackedArray]:
        """Compensate, pack and remember in one step: what to send this round."""

        compensated = self.compensate(arrays)
        packed = pack_arrays(compensated, spec, rng)
        self.remember(unpack_arrays(packed), compensated)
        return packed

    def residual_norm(self) -> float:
        """L2 norm of the whole residual (0.0 when empty)."""
        return math.sqrt(sum(float(np.dot(r.reshape(-1).astype(np.float64), r.reshape(-1).astype(np.float64)))
                             for r in self._residual.values()))

    def reset(self) -> None:
        self._residual.clear()

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: r.copy() for name, r in self._residual.items()}

    def load_state_dict(self, state: Mapping[str, np.ndarray], expected: Layout | None = None) -> None:
        """Restore a saved residual: float32/float64 arrays, finite, and when ``expected`` is given,
        names and shapes/dtypes of that layout. Raises ValueError, leaving the residual as it was."""
        loaded: dict[str, np.ndarray] = {}
        for name, array in state.items():
            if not isinstance(name, str) or not isinstance(array, np.ndarray):
                raise ValueError(f"residual entry {name!r} is not a named array")
            if array.dtype.kind != "f" or array.dtype.itemsize not in (4, 8):
                raise ValueError(f"residual {name} is {array.dtype}, expected float32 or float64")
            if array.size and not all_finite(array):
                raise ValueError(f"residual {name} holds NaN or Inf")
            if expected is not None:
                if name not in expected:
                    raise ValueError(f"residual {name} is not in the model's layout")
                shape, dtype = expected[name]
                if tuple(array.shape) != tuple(shape) or array.dtype.str != dtype:
                    raise ValueError(f"residual {name} is {array.dtype.str}{list(array.shape)}, "
                                     f"expected {dtype}{list(shape)}")
            loaded[name] = np.array(array, copy=True)
        self._residual = loaded
