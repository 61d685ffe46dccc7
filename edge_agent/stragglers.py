"""Simulated stragglers: extra compute time per training round, drawn from a distribution.

Off by default. For demos, benchmarks and chaos tests: simulated devices on one machine all
train about equally fast, while real phones and Raspberry Pis are slower and vary from round
to round. The draw is seeded by (agent, round), so a run can be repeated.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

DelayKind = Literal["off", "constant", "uniform", "lognormal", "exponential"]

MAX_DELAY_S = 3600.0


@dataclass(frozen=True)
class DelayModel:
    kind: DelayKind = "off"
    a: float = 0.0
    """constant: seconds; uniform: low; lognormal: median; exponential: mean."""
    b: float = 0.0
    """uniform: high; lognormal: sigma of the underlying normal."""

    def sample(self, agent_id: str, round_number: int) -> float:
        """Seconds to add to this agent's training in this round (never negative, at most an hour)."""
        rng = np.random.default_rng([zlib.crc32(agent_id.encode()), round_number])
        if self.kind == "off":
            value = 0.0
        elif self.kind == "constant":
            value = self.a
        elif self.kind == "uniform":
            value = rng.uniform(self.a, self.b)
        elif self.kind == "lognormal":
            value = self.a * math.exp(self.b * rng.standard_normal())
        else:
            value = rng.exponential(self.a)
        return float(min(MAX_DELAY_S, max(0.0, value)))

    def __str__(self) -> str:
        if self.kind == "off":
            return "off"
        if self.kind in ("uniform", "lognormal"):
            return f"{self.kind}:{self.a:g},{self.b:g}"
        return f"{self.kind}:{self.a:g}"


OFF = DelayModel()

PROFILE_DELAYS: dict[str, DelayModel] = {
    "jetson": DelayModel("lognormal", 0.5, 0.5),
    "rpi": DelayModel("lognormal", 3.0, 0.6),
    "phone": DelayModel("lognormal", 6.0, 0.9),
    "cpu": OFF,
}
"""Rough shapes, not measurements: a phone is slower and far more variable than a Jetson."""


def parse_delay(text: str, device: str) -> DelayModel:
    """``off``, ``profile``, ``constant:S``, ``uniform:A,B``, ``lognormal:MEDIAN,SIGMA`` or ``exponential:MEAN``.

    Raises ValueError naming what is wrong; ``profile`` picks ``device``'s distribution.
    """
    text = text.strip().lower()
    if text in ("off", ""):
        return OFF
    if text == "profile":
        return PROFILE_DELAYS.get(device, OFF)
    kind, _, args = text.partition(":")
    try:
        values = [float(v) for v in args.split(",")] if args else []
    except ValueError:
        raise ValueError(f"straggler_delay {text!r}: parameters must be numbers") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"straggler_delay {text!r}: parameters must be finite")
    expected = {"constant": 1, "exponential": 1, "uniform": 2, "lognormal": 2}
    if kind not in expected:
        raise ValueError(f"straggler_delay {text!r}: use off, profile, constant:S, uniform:A,B, "
                         "lognormal:MEDIAN,SIGMA or exponential:MEAN")
    if len(values) != expected[kind]:
        raise ValueError(f"straggler_delay {text!r}: {kind} takes {expected[kind]} parameter(s)")
    a, b = values[0], values[1] if len(values) > 1 else 0.0
    if kind == "constant" and a < 0:
        raise ValueError(f"straggler_delay {text!r}: seconds must be >= 0")
    if kind == "uniform" and not 0 <= a <= b:
        raise ValueError(f"straggler_delay {text!r}: needs 0 <= A <= B")
    if kind == "lognormal" and (a <= 0 or b < 0):
        raise ValueError(f"straggler_delay {text!r}: needs MEDIAN > 0 and SIGMA >= 0")
    if kind == "exponential" and a <= 0:
        raise ValueError(f"straggler_delay {text!r}: needs MEAN > 0")
    return DelayModel(kind, a, b)  # type: ignore[arg-type]
