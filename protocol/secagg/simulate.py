"""A whole round in one process: the reference order of calls for the wiring, and the driver of the
tests and of bench/secagg.py. Messages are handed over in memory; agents drop out where told.

CPU time (time.process_time) is taken per stage for each agent and for the server, so the figures
hold on a busy machine. An agent whose own checks abort it leaves the round, as it would over MQTT.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from protocol.secagg.client import SecAggClient
from protocol.secagg.config import RoundConfig
from protocol.secagg.errors import SecAggAborted
from protocol.secagg.server import SecAggServer

CLIENT_STAGES = ("advertise", "share", "mask", "unmask")
SERVER_STAGES = ("advertise", "share", "mask", "unmask")


@dataclass(frozen=True)
class Dropouts:
    """Who vanishes when. ``before_advertise`` never shows up; the others leave after that stage."""

    before_advertise: frozenset[str] = frozenset()
    after_advertise: frozenset[str] = frozenset()
    after_sharing: frozenset[str] = frozenset()
    after_masking: frozenset[str] = frozenset()


@dataclass
class RoundResult:
    total: np.ndarray  # the unmasked sum, uint32
    survivors: frozenset[str]  # whose inputs the sum holds
    recovered: frozenset[str]  # dropped agents whose pairwise masks were removed
    client_cpu: dict[str, list[float]] = field(default_factory=dict)  # stage -> seconds of each agent
    server_cpu: dict[str, float] = field(default_factory=dict)  # stage -> seconds (receiving + closing)
    upload_bytes: dict[str, list[int]] = field(default_factory=dict)  # stage -> bytes each agent sent
    client_aborts: dict[str, str] = field(default_factory=dict)  # agent -> reason it left


def _timed(clock: dict[str, float], stage: str, call: Callable[[], object]) -> object:
    start = time.process_time()
    try:
        return call()
    finally:
        clock[stage] = clock.get(stage, 0.0) + time.process_time() - start


def run_round(config: RoundConfig, inputs: Callable[[str], np.ndarray], dropouts: Dropouts = Dropouts(),
              late: Callable[[SecAggServer, dict[str, SecAggClient]], None] | None = None) -> RoundResult:
    """Run the four stages; ``inputs(agent)`` gives an agent's quantised uint32 vector when it masks.

    ``late``, if given, is called once the server has fixed the survivors (tests use it to play a late
    agent). Raises SecAggAborted if the server aborts the round.
    """
    server = SecAggServer(config)
    result = RoundResult(np.zeros(0, np.uint32), frozenset(), frozenset(),
                         {s: [] for s in CLIENT_STAGES}, {s: 0.0 for s in SERVER_STAGES},
                         {s: [] for s in CLIENT_STAGES})
    clients = {a: SecAggClient(a, config) for a in config.roster if a not in dropouts.before_advertise}

    def client_step(agent: str, stage: str, call: Callable[[], object]) -> object | None:
        clock: dict[str, float] = {}
        try:
            return _timed(clock, stage, call)
        except SecAggAborted as exc:
            result.client_aborts[agent] = exc.reason
            clients.pop(agent)
            return None
        finally:
            result.client_cpu[stage].append(clock[stage])

    for agent in list(clients):
        ad = client_step(agent, "advertise", clients[agent].advertise)
        result.upload_bytes["advertise"].append(ad.nbytes)
        _timed(result.server_cpu, "advertise", lambda ad=ad: server.receive_advertisement(ad))
    for agent in dropouts.after_advertise:
        clients.pop(agent, None)
    keys = _timed(result.server_cpu, "advertise", server.close_advertising)

    for agent in list(clients):
        bundles = client_step(agent, "share", lambda c=clients[agent], k=keys[agent]: c.share_keys(k))
        if bundles is not None:
            result.upload_bytes["share"].append(sum(len(b) for b in bundles.values()))
            _timed(result.server_cpu, "share", lambda a=agent, b=bundles: server.receive_shares(a, b))
    for agent in dropouts.after_sharing:
        clients.pop(agent, None)
    inbox = _timed(result.server_cpu, "share", server.close_sharing)

    for agent in list(clients):
        masked = client_step(agent, "mask", lambda c=clients[agent], a=agent: c.masked_input(inputs(a), inbox[a]))
        if masked is not None:
            result.upload_bytes["mask"].append(masked.nbytes)
            _timed(result.server_cpu, "mask", lambda a=agent, m=masked: server.receive_masked_input(a, m))
        del masked
    for agent in dropouts.after_masking:
        clients.pop(agent, None)
    request = _timed(result.server_cpu, "mask", server.close_masking)
    if late is not None:
        late(server, clients)

    for agent in list(clients):
        response = client_step(agent, "unmask", lambda c=clients[agent]: c.unmask(request))
        if response is not None:
            result.upload_bytes["unmask"].append(response.nbytes)
            _timed(result.server_cpu, "unmask", lambda r=response: server.receive_unmask_response(r))
    result.total = _timed(result.server_cpu, "unmask", server.finish)
    result.survivors, result.recovered = server.survivors, server.recovered
    return result
