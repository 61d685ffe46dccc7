"""FedProto across a jetson, an rpi and a phone (three model families), as separate processes.

Checks on the wire, with an independent subscriber, that agents published nothing but their
status and updates holding per-class prototypes with counts: never weights, deltas or
control variates. Their personal models stay in their state directories.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_agent.models import EMBED_DIM
from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import AgentStatus, GlobalState, RoundAnnouncement, Update
from protocol.topics import Topics
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    wait_for_rounds,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FEDERATION = "protos"
ROUNDS = 3
CLASSES = 10


def test_fedproto_fleet_publishes_only_prototypes(tmp_path: Path, mosquitto: MosquittoBroker,
                                                   recorder: WireRecorder) -> None:
    agents = [AgentSpec("jetson-0", "jetson", 0), AgentSpec("rpi-1", "rpi", 1), AgentSpec("phone-2", "phone", 2)]
    spec = FleetSpec(agents=agents, partition="classes", agent_settings={"classes_per_client": 4})
    fleet = Fleet(tmp_path / "run", mosquitto.url, spec, {
        "algorithm": "fedproto", "rounds": ROUNDS, "min_available_agents": 3, "min_fit_agents": 3,
        "local_epochs": 1, "proto_lambda": 1.0, "proto_warmup_rounds": 1, "proto_momentum": 0.5,
        "proto_normalize": True, "round_deadline_s": 120,
    }, federation=FEDERATION)
    with fleet:
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 300)  # three rounds and the evaluation
        assert_agents_exit_cleanly(fleet, 60)
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert_all_completed(rounds, ROUNDS + 1)

    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]
    from_agents = [(parsed, m) for parsed, m in seen if parsed.agent_id is not None]
    assert {parsed.kind for parsed, _ in from_agents} == {"agent_status", "update"}
    for parsed, message in from_agents:
        if parsed.kind == "agent_status":
            assert decode_wire(message.payload, AgentStatus).agent_id == parsed.agent_id

    updates = [decode_wire(m.payload, Update) for parsed, m in from_agents if parsed.kind == "update"]
    assert len(updates) == len(agents) * (ROUNDS + 1)
    assert {u.family for u in updates} == {"cnn_large", "cnn_small", "mlp_tiny"}
    for update in updates:
        assert not update.weights and not update.delta and not update.control_delta, update.agent_id
        if update.task == "evaluate":
            assert update.prototypes is None
            assert {"head_accuracy", "proto_accuracy"} <= update.metrics.extra.keys()
            continue
        assert update.prototypes is not None and update.prototype_counts is not None
        assert update.prototypes.shape == (CLASSES, EMBED_DIM) and update.prototypes.dtype == np.float32
        held = update.prototype_counts > 0
        assert held.sum() == 4 and update.prototype_counts.sum() == update.num_samples
        assert not update.prototypes[~held].any()
        np.testing.assert_allclose(np.linalg.norm(update.prototypes[held], axis=1), 1.0, rtol=1e-4)
        if update.round > 1:  # global prototypes exist from round 2 on
            assert {"proto_accuracy", "proto_distance"} <= update.metrics.extra.keys()
    upload = [len(m.payload) for parsed, m in from_agents if parsed.kind == "update" and parsed.round <= ROUNDS]
    assert max(upload) <= CLASSES * EMBED_DIM * 4 + 2048, upload

    # One set of global prototypes per round, published under every family's topic, no weights.
    states = [decode_wire(m.payload, GlobalState) for parsed, m in seen
              if parsed.kind == "global_state" and m.payload]
    by_round: dict[int, set[str]] = {}
    for state in states:
        assert not state.weights and state.prototypes is not None
        by_round.setdefault(state.round, set()).add(state.digest)
    assert sorted(by_round) == list(range(2, ROUNDS + 2)) and all(len(d) == 1 for d in by_round.values())
    announcements = [decode_wire(m.payload, RoundAnnouncement) for parsed, m in seen
                     if parsed.kind == "round" and m.payload]
    lambdas = {a.round: a.params["lambda"] for a in announcements if a.task == "train"}  # republished: same
    assert lambdas == {1: 0.0, 2: 1.0, 3: 1.0}  # warm-up over one round

    # The personal models stayed on the devices.
    for agent in agents:
        assert len(list(fleet.agent_dir(agent.name).glob(f"fedproto-*-{spec.family_of(agent)}.msgpack"))) == 1
