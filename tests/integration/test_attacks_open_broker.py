"""An attacker on an open broker (no ACL, no passwords) against a live federation.

One MQTT client that anyone could run: it plants forged retained messages before the fleet
starts (a "finished" coordinator status, a hostile round announcement, global states with
huge round numbers, unsigned and signed with its own key), floods the coordinator with the
statuses of 2,000 made-up agents, and sends forged updates under a real agent's id. Enrolled
agents act only on what the coordinator's key signed, and the coordinator only on what an
enrolled agent's key signed, so every forgery is dropped and counted with its reason, and the
run completes with every agent answering every round.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import (
    AgentStatus,
    CoordinatorStatus,
    GlobalState,
    LocalTraining,
    RoundAnnouncement,
    TrainMetrics,
    Update,
)
from protocol.signing import SigningKey
from protocol.topics import Topics
from protocol.wire import encode_message
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    metric,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

FEDERATION = "attacked"
ROUNDS = 3
FLOOD = 2_000
AGENTS = [AgentSpec("phone-0", "phone", 0), AgentSpec("rpi-1", "rpi", 1), AgentSpec("phone-2", "phone", 2)]
TOPICS = Topics(FEDERATION)


class Attacker:
    """A plain paho client; paho's own loop thread does every socket write."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("mqtt://").split(":")
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="mallory",
                                  protocol=paho.MQTTv311)
        self.client.max_inflight_messages_set(1000)
        self.client.connect(host, int(port))
        self.client.loop_start()
        self.key = SigningKey.generate()  # a key nobody enrolled

    def send(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(30)

    def both(self, topic: str, message: object, *, retain: bool = False) -> None:
        """The message unsigned, then signed with the attacker's own key."""
        plain = encode_message(message)  # type: ignore[arg-type]
        self.send(topic, plain, retain=retain)
        self.send(topic, encode_message(self.key.seal(plain)), retain=retain)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def plant_forgeries(attacker: Attacker) -> None:
    now = time.time()
    attacker.both(TOPICS.coordinator_status, CoordinatorStatus(
        federation=FEDERATION, run_id="forged", session="forged", state="finished", round=99, algorithm="fedavg",
        version="0", timestamp=now), retain=True)
    attacker.both(TOPICS.rounds_current, RoundAnnouncement(
        run_id="forged", round=999, task="train", algorithm="fedavg",
        training=LocalTraining(epochs=50, learning_rate=10.0), selected=[a.name for a in AGENTS], states={},
        init_seed=1, issued_at=now, deadline_s=3600.0, last_round=999), retain=True)
    for family in ("mlp_tiny", "cnn_small"):
        weights = {"w": np.full(4, 1e6, dtype=np.float32)}
        attacker.both(TOPICS.global_state(family, 9_999_999), GlobalState(
            run_id="forged", family=family, round=9_999_999, weights=weights,
            digest=GlobalState.compute_digest(weights, {}, None, None)), retain=True)


def flood_statuses(attacker: Attacker) -> None:
    for i in range(FLOOD):
        agent_id = f"sybil-{i:05d}"
        status = AgentStatus(agent_id=agent_id, state="online", device="phone", family="mlp_tiny", num_samples=10**6,
                             num_eval_samples=1, version="0", timestamp=time.time())
        attacker.client.publish(TOPICS.agent_status(agent_id), encode_message(status), qos=1)
    attacker.send(TOPICS.agent_status("sybil-last"), b"\x80")  # acknowledged after all the others


def forge_updates(attacker: Attacker, announcement: RoundAnnouncement) -> None:
    """Updates in phone-0's name for the open round: a huge claimed weight and huge values."""
    update = Update(run_id=announcement.run_id, agent_id="phone-0", round=announcement.round, task="train",
                    family="mlp_tiny", base_digest=None, num_samples=10**9,
                    weights={"w": np.full(4, 1e30, dtype=np.float32)}, metrics=TrainMetrics())
    attacker.both(TOPICS.update("phone-0", announcement.round), update)


def test_forgeries_on_an_open_broker_are_dropped_counted_and_change_nothing(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    attacker = Attacker(mosquitto.url)
    plant_forgeries(attacker)
    port = free_port()
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=AGENTS, alpha=1.0), {
        "rounds": ROUNDS, "min_available_agents": len(AGENTS), "min_fit_agents": len(AGENTS), "local_epochs": 2,
        "round_deadline_s": 120, "http_port": port, "exit_when_finished": False,
    }, federation=FEDERATION)
    try:
        with fleet:
            flood_statuses(attacker)
            wait_until(lambda: _announced(recorder) is not None, 120, "the coordinator's first announcement")
            forge_updates(attacker, _announced(recorder))  # type: ignore[arg-type]
            rounds = wait_for_rounds(fleet, ROUNDS + 1, 300)
            samples = scrape(port)
            assert_agents_exit_cleanly(fleet, 60)  # their last statuses carry what they dropped
    finally:
        attacker.close()
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == r["selected"] == len(AGENTS) for r in rounds), rounds

    # The coordinator dropped every forgery for what it was, and took no sybil in.
    def rejected(kind: str, reason: str) -> float:
        return metric(samples, "fl_messages_rejected_total", kind=kind, reason=reason)

    assert rejected("agent_status", "unsigned") >= FLOOD
    assert rejected("update", "unsigned") >= 1 and rejected("update", "unknown_signer") >= 1
    assert metric(samples, "fl_updates_total", outcome="accepted") == len(AGENTS) * (ROUNDS + 1)

    # Each agent dropped the planted messages (its status counts them) and never trained the forged round.
    statuses = [decode_wire(m.payload, AgentStatus) for m in recorder.snapshot(
        lambda s: "/agents/" in s.topic and bool(s.payload))]
    for agent in AGENTS:
        assert max(s.rejected for s in statuses if s.agent_id == agent.name) >= 2, agent.name
    updates = [decode_wire(m.payload, Update) for m in recorder.snapshot(
        lambda s: "/updates/" in s.topic and bool(s.payload))]
    assert not [u for u in updates if u.run_id == "forged" or u.round == 999]
    final = rounds[-1]
    assert final["accuracy"] is not None and final["accuracy"] > 0.8, final


def _announced(recorder: WireRecorder) -> RoundAnnouncement | None:
    """The coordinator's newest announcement on the wire (not the forged run's)."""
    for message in reversed(recorder.snapshot(lambda s: s.topic == TOPICS.rounds_current and bool(s.payload))):
        announcement = decode_wire(message.payload, RoundAnnouncement)
        if announcement.run_id != "forged":
            return announcement
    return None

