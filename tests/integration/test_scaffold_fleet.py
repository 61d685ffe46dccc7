"""SCAFFOLD over a real broker with agents as processes: what crosses the wire adds up.

The server variate each round must equal the previous one plus |S|/N times the sample-weighted
mean of the control deltas the agents published (N: the 4 agents the coordinator knows, |S|: the 2 it
selected), recomputed here from the recorded updates alone. The run announces ``absent_class_scale``, which the
agents accept (an agent skips a round whose params it does not know), and a local learning rate halved each round.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import GlobalState, RoundAnnouncement, Update
from protocol.topics import Topics
from tests.integration.wire import WireRecorder, assert_all_completed, decode_wire, wait_for_rounds

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FEDERATION = "scaffold"
ROUNDS = 3


def test_scaffold_fleet_updates_the_server_variate_from_what_agents_sent(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    agents = [AgentSpec(f"rpi-{i}", "rpi", i) for i in range(4)]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=0.5), {
        "algorithm": "scaffold", "rounds": ROUNDS, "min_available_agents": 4, "min_fit_agents": 2,
        "fraction_fit": 0.5, "local_epochs": 1, "server_learning_rate": 0.8, "round_deadline_s": 120,
        "scaffold_absent_class_scale": 0.5,  # announced to the agents, which train with it (rounds complete)
        "learning_rate": 0.05, "learning_rate_decay": 0.5,  # each round announces half the last one's rate
        # SCAFFOLD's arithmetic on exactly what the agents sent: no claim cut, no delta clipped (tested elsewhere)
        "claim_cap_multiple": 0, "max_norm_ratio": 0,
    }, federation=FEDERATION)
    with fleet:
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 300)  # three rounds and the evaluation
    assert_all_completed(rounds, ROUNDS + 1)

    topics = Topics(FEDERATION)
    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]
    announcements = {a.round: a for a in (decode_wire(m.payload, RoundAnnouncement) for p, m in seen
                                          if p.kind == "round" and m.payload)}
    states = {s.round: s for s in (decode_wire(m.payload, GlobalState) for p, m in seen
                                   if p.kind == "global_state" and m.payload)}
    updates: dict[int, list[Update]] = {}
    for parsed, message in seen:
        if parsed.kind == "update":
            update = decode_wire(message.payload, Update)
            updates.setdefault(update.round, []).append(update)

    control: dict[str, np.ndarray] | None = None
    for number in range(1, ROUNDS + 1):
        assert announcements[number].training.momentum == 0.0
        assert announcements[number].training.learning_rate == pytest.approx(0.05 * 0.5 ** (number - 1))
        assert announcements[number].params == {"absent_class_scale": 0.5}
        sent = updates[number]
        assert sorted(u.agent_id for u in sent) == announcements[number].selected and len(sent) == 2
        for update in sent:
            assert (update.weights if number == 1 else update.delta).keys() == update.control_delta.keys()
        new = states[number + 1].control
        if control is None:
            control = {name: np.zeros_like(a) for name, a in new.items()}
        for name, value in new.items():
            mean = np.average([u.control_delta[name].astype(np.float64) for u in sent], axis=0,
                              weights=[u.num_samples for u in sent])  # weighted like the deltas
            np.testing.assert_allclose(value, control[name] + 2 / 4 * mean, rtol=1e-4, atol=1e-6)
        if number > 1:  # the global step: x + 0.8 * sample-weighted mean delta
            previous, weights = states[number].weights, np.array([u.num_samples for u in sent], np.float64)
            for name in ("head.bias", "features.0.weight"):
                mean = np.average([u.delta[name].astype(np.float64) for u in sent], axis=0, weights=weights)
                np.testing.assert_allclose(states[number + 1].weights[name], previous[name] + 0.8 * mean,
                                           rtol=1e-4, atol=1e-6)
        control = dict(new)
    for agent in agents:  # each agent that trained kept its variate, keyed by run and family
        trained = any(u.agent_id == agent.name for sent in updates.values() for u in sent if u.task == "train")
        kept = list(fleet.agent_dir(agent.name).glob("scaffold-*-cnn_small.msgpack"))
        assert len(kept) == (1 if trained else 0), agent.name
