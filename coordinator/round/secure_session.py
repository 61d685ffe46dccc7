"""One SecAgg+ session of a secure round at the root (``coordinator/round/secure.py``), the stages' clock, and how an
agent's stage message enters a session's server (the root's sessions and a site's, ``coordinator/sites/secure.py``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.aggregation.running_mean import RunningMean, layout_key
from protocol.messages import TrainMetrics
from protocol.secagg.errors import SecAggRefused
from protocol.secagg.messages import Advertisement, UnmaskResponse
from protocol.secagg.server import SecAggServer
from protocol.secagg.vector import unpack_masked
from protocol.secagg.wire import SecureFamily

STAGES = ("advertise", "share", "mask", "unmask")
TOPIC_STAGE = {"advertise": "advertise", "shares": "share", "masked": "mask", "reveal": "unmask"}
"""The last level of an agent's stage topic -> the stage it answers."""


@dataclass
class Session:
    """One family's SecAgg+ session in the open round (under FedProto, one across every family)."""

    family: str  # the family's name, or under FedProto the families' joined (secure_plan.shared_session)
    setup: SecureFamily
    server: SecAggServer
    like: dict[str, np.ndarray]
    """The family's global weights: the layout the sum is read back into."""
    control_like: dict[str, np.ndarray] | None = None
    """SCAFFOLD: the family's server control variate, the layout of the control deltas' sum (None: not masked)."""
    prototypes: tuple[int, int] | None = None
    """FedProto: (classes, dim) of the prototypes whose per-class sums and counts are masked instead of a delta."""
    members: dict[str, set[str]] = field(default_factory=lambda: {s: set() for s in STAGES})  # per stage (U1..U4)
    metrics: dict[str, TrainMetrics] = field(default_factory=dict)
    families: dict[str, str] = field(default_factory=dict)  # each agent's, as it advertised: it counts for that one
    relays: tuple[str, ...] = ()
    """The families whose relay topics carry this session's keys and unmasking request."""


@dataclass
class StageClock:
    stage: str = "idle"
    opened: float = 0.0
    deadline: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    bytes_in: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STAGES})
    bytes_out: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STAGES})


def grouped_sessions(families: Mapping[str, SecureFamily]) -> dict[str, tuple[SecureFamily, tuple[str, ...]]]:
    """The distinct sessions of an announcement's ``families`` (family -> its session; under FedProto one session
    stands under every family's name): each under its first family's name, with all of its families in order
    (the relay topics its keys and unmasking request go to)."""
    grouped: dict[tuple[tuple[str, ...], bytes], list[str]] = {}
    for family, session in sorted(families.items()):
        grouped.setdefault((tuple(session.roster), session.graph_seed), []).append(family)
    return {names[0]: (families[names[0]], tuple(names)) for names in grouped.values()}


def take_stage(server: SecAggServer, setup: SecureFamily, families: Collection[str], agent: str, stage: str,
               message: Any, metrics: dict[str, TrainMetrics]) -> None:
    """``agent``'s message of ``stage`` into ``server`` (an advertisement must name one of ``families``; a masked
    input's held-out metrics go to ``metrics``); raises SecAggRefused for one the session cannot take."""
    if stage == "advertise":
        if message.family not in families:
            raise SecAggRefused(f"an advertisement for {message.family}, {agent} is in a session of "
                                f"{', '.join(sorted(families))}")
        k = message.keys
        server.receive_advertisement(Advertisement(agent, k.encryption_key, k.mask_key, k.commitment))
    elif stage == "share":
        server.receive_shares(agent, dict(message.bundles))
    elif stage == "mask":
        server.expect_masked_input(agent)  # before unpacking: a refused upload costs no more than its bytes
        try:  # the low ring_bits bits of each element, packed (protocol.secagg.ring)
            masked = unpack_masked(message.masked, setup)
        except ValueError as exc:
            raise SecAggRefused(f"a masked input from {agent!r}: {exc}") from exc
        server.receive_masked_input(agent, masked)
        metrics[agent] = TrainMetrics.model_construct(
            eval_loss=message.eval_loss, eval_accuracy=message.eval_accuracy,
            num_eval_samples=message.num_eval_samples, train_loss=message.train_loss)
    else:
        server.receive_unmask_response(UnmaskResponse(agent, dict(message.self_mask_shares),
                                                      dict(message.key_shares)))


def sample_means(sums: dict[str, dict[str, np.ndarray]], weight: float, count: int, cap: int,
                 like: dict[str, np.ndarray], control_like: dict[str, np.ndarray] | None) -> dict[str, RunningMean]:
    """A session's unmasked sums (``decode_sum``: payload -> array sums, in the session's weight units
    min(samples, cap) / cap) as running means in samples: sessions of one family (the root's and the sites', each
    with its own cap) then fold together. One weight for every payload: an agent weighed its delta and control
    delta alike (sample-weighted means, as Scaffold.aggregate takes them in a plain round)."""
    layouts = {"delta": like, "control_delta": control_like or {}}
    return {payload: RunningMean.of_sums(layout_key(layouts[payload]), {n: a * cap for n, a in payload_sums.items()},
                                         {n: np.zeros_like(a) for n, a in layouts[payload].items()
                                          if a.dtype.kind != "f"}, weight * cap, count, (0.0, ""))
            for payload, payload_sums in sums.items()}
