"""An agent compresses its delta as the round asks, after everything else (DP included) is done.

Compression is post-processing of the update the agent would have sent: under DP-SGD the delta
is already privatised, so compressing it costs no privacy. fp16 and int8 (stochastic rounding,
unbiased) need no memory; top-k (a compressor with ``error_feedback``) keeps what it did not send
as an error-feedback residual in the state directory, per run and family (``ef-{run}-{family}``),
added to the next round's delta, so a reboot does not lose it. Integer arrays (counters) always
travel uncompressed.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Collection
from typing import Any

import numpy as np

from edge_agent.state import AgentStateDir
from protocol.arrays import layout_of
from protocol.compression import COMPRESSORS, CompressionSpec, kind_of, pack_arrays, split_compressible
from protocol.compression.error_feedback import ErrorFeedback

log = logging.getLogger(__name__)

FILE_PREFIX = "ef-"
CONTROL = "control/"
"""Prefix of the control delta's residuals in the error-feedback file (parameter names hold no '/')."""


class DeltaCompressor:
    """One round's compression of one update; ``commit`` once the update is known to be sent."""

    def __init__(self, state: AgentStateDir, agent_id: str, run_id: str, family: str, round_number: int) -> None:
        self.state = state
        self.name = f"{FILE_PREFIX}{run_id}-{family}"
        self.seed = zlib.crc32(f"{agent_id}:{run_id}:{round_number}".encode())
        self._feedback: ErrorFeedback | None = None
        self.residual_norm: float | None = None
        self.declined: str | None = None
        """Why the delta went uncompressed although the round asked for compression."""

    def compress(self, payload: dict[str, Any], compression: str, usable: Collection[str] | None = None) -> dict[str, Any]:
        """``payload`` with its delta's float arrays moved, packed, into ``packed_delta`` (and
        SCAFFOLD's control delta into ``packed_control_delta``).

        Uncompressed, with ``declined`` saying why, when ``compression``'s kind is one this agent does
        not implement (a newer coordinator's: the wire lets it through), is not among the ``usable``
        ones (what this device was configured to use; default: every registered one), or packing fails."""
        kind = kind_of(compression)
        delta = payload.get("delta")
        if kind == "none" or not delta:
            return payload  # nothing to compress (e.g. a bootstrap round sends whole weights)
        usable = COMPRESSORS.names() if usable is None else usable
        if kind not in COMPRESSORS:
            self.declined = f"this agent does not implement compressor {kind} (it implements {', '.join(COMPRESSORS.names())})"[:200]
            return payload
        if kind not in usable:
            self.declined = f"this agent does not use {kind} (its compressors: {', '.join(sorted(usable)) or 'none'})"[:200]
            return payload
        spec = CompressionSpec.parse(compression)  # a known kind: the wire already checked its argument
        floats, rest = split_compressible(delta)
        control_floats, control_rest = split_compressible(payload.get("control_delta") or {})
        rng = np.random.default_rng(self.seed)
        try:
            if COMPRESSORS.get(kind).error_feedback:  # one residual file: the control delta's arrays under CONTROL names
                controls = {CONTROL + name: array for name, array in control_floats.items()}
                feedback = self._load_feedback({**floats, **controls})
                packed = feedback.pack(floats, spec, rng)
                packed_control = {name.removeprefix(CONTROL): p for name, p in feedback.pack(controls, spec, rng).items()}
                self._feedback, self.residual_norm = feedback, feedback.residual_norm()
            else:
                packed = pack_arrays(floats, spec, rng)
                packed_control = pack_arrays(control_floats, spec, rng)
        except ValueError as exc:  # e.g. arrays over the packed bounds: the plain delta still helps the round
            self.declined = f"could not compress with {spec}: {exc}"[:200]
            self._feedback = self.residual_norm = None
            return payload
        out = {**payload, "delta": rest, "packed_delta": packed}
        if control_floats:
            out.update(control_delta=control_rest, packed_control_delta=packed_control)
        return out

    def commit(self) -> None:
        """Keep the residual (top-k): only for an update that passed validation and will be sent."""
        if self._feedback is not None:
            self.state.remove_matching(FILE_PREFIX, keep=self.name)  # earlier runs' residuals
            self.state.write_arrays(self.name, self._feedback.state_dict())

    def _load_feedback(self, floats: dict[str, np.ndarray]) -> ErrorFeedback:
        feedback = ErrorFeedback()
        try:
            saved = self.state.read_arrays(self.name)
            if saved is not None:
                feedback.load_state_dict(saved, layout_of(floats))
        except ValueError as exc:  # a residual of another model or a damaged file: start from zero
            log.warning("error-feedback residual %s unusable (%s); starting from zero", self.name, exc)
        return feedback
