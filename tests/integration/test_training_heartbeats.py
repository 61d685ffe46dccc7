"""An agent keeps heartbeating, and keeps listening, while a long local training runs.

Real parts over a real Mosquitto: the in-process coordinator service, an ``EdgeAgent`` with a
real ``LocalWorker`` whose training is held at a gate. The gate opens only once the wire shows
``BEATS`` more heartbeats of the agent since the round started training: as the loop spaces
its heartbeats at least ``HEARTBEAT_S`` apart, the training then lasted longer than the
coordinator's ``agent_timeout_s`` by construction, with no sleep deciding the outcome. Training
on the loop's thread (the old agent) sends no heartbeat at all, so the gate never sees them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import torch
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client import CollectorRegistry

from coordinator.app.service import CoordinatorService
from coordinator.fleet.enrollment import enroll
from coordinator.settings import CoordinatorSettings
from edge_agent.agent import EdgeAgent
from edge_agent.profiles import get_profile
from edge_agent.state import AgentStateDir
from edge_agent.worker import LocalWorker
from launcher.broker import MosquittoBroker
from protocol.messages import AgentStatus, GlobalState, PrivacySpent, RoundAnnouncement, Update
from protocol.security.signing import SigningKey
from protocol.topics import Topics
from protocol.transport.mqtt import Backoff, BrokerAddress
from protocol.wire import encode_message
from service_kit.keys import load_or_create_signing_key
from tests.integration.wire import WireRecorder, decode_wire, read_rounds, wait_until
from tests.unit.edge_agent.rounds import AGENT, TASK, announce, digits_subset

pytestmark = pytest.mark.integration

FEDERATION = "busy"
TOPICS = Topics(FEDERATION)
HEARTBEAT_S = 0.25
AGENT_TIMEOUT_S = 2.0
BEATS = math.ceil(AGENT_TIMEOUT_S / HEARTBEAT_S) + 2
"""Heartbeats seen after training began: they span at least (BEATS - 1) * HEARTBEAT_S > AGENT_TIMEOUT_S."""
WAIT_S = 120.0
"""Generous bound on each wait: a failure, never a pass, depends on it."""


class GatedWorker(LocalWorker):
    """A real worker whose every round first waits at ``gate`` (given the round), and which counts privacy
    reads made by another thread while it trains (the heartbeat must not read the ledger training changes)."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(AGENT, TASK, "mlp_tiny", digits_subset(), torch.device("cpu"), batch_size=16,
                         state=AgentStateDir(state_dir))
        self.gate: Callable[[int], None] = lambda round_number: None
        self.trained: list[int] = []
        self.reads_while_training = 0
        self._trainer: int | None = None

    def answer(self, announcement: RoundAnnouncement, global_state: GlobalState | None) -> Update:
        self._trainer = threading.get_ident()
        try:
            self.gate(announcement.round)
            update = super().answer(announcement, global_state)
        finally:
            self._trainer = None
        self.trained.append(announcement.round)
        return update

    def privacy_spent(self) -> PrivacySpent | None:
        if self._trainer is not None and self._trainer != threading.get_ident():
            self.reads_while_training += 1
        return super().privacy_spent()


def heartbeats(recorder: WireRecorder) -> int:
    return len(recorder.snapshot(lambda m: m.topic == TOPICS.agent_status(AGENT) and m.payload != b""
                                 and decode_wire(m.payload, AgentStatus).state == "online"))


def updates(recorder: WireRecorder) -> list[int]:
    return [TOPICS.parse(m.topic).round for m in recorder.snapshot(lambda m: "/updates/" in m.topic)]  # type: ignore[misc]


def make_agent(tmp_path: Path, broker: MosquittoBroker, worker: GatedWorker, **options: object) -> EdgeAgent:
    return EdgeAgent(AGENT, FEDERATION, BrokerAddress.parse(broker.url), get_profile("phone"), worker,
                     AgentStateDir(tmp_path / "agent"), heartbeat_s=HEARTBEAT_S, backoff=Backoff(0.1, 1.0),
                     **options)  # type: ignore[arg-type]


@pytest.fixture
def worker(tmp_path: Path) -> GatedWorker:
    return GatedWorker(tmp_path / "agent")


def start(target: Callable[[threading.Event], int], stop: threading.Event, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
    thread.start()
    return thread


def test_a_round_longer_than_the_agent_timeout_is_not_a_dropout(tmp_path: Path, mosquitto: MosquittoBroker,
                                                                recorder: WireRecorder,
                                                                worker: GatedWorker) -> None:
    settings = CoordinatorSettings(
        federation=FEDERATION, broker_url=mosquitto.url, state_dir=tmp_path / "coordinator", http_port=0,
        http_host="127.0.0.1", rounds=2, evaluate_final=False, min_available_agents=1, min_fit_agents=1,
        local_epochs=1, round_deadline_s=600.0, agent_timeout_s=AGENT_TIMEOUT_S, exit_when_finished=True,
        reconnect_min_s=0.1, reconnect_max_s=1.0)
    service = CoordinatorService(settings, CollectorRegistry())
    seen: dict[int, tuple[bool, bool]] = {}
    """round -> (the gate saw BEATS heartbeats during training, the coordinator then held the agent online)"""

    def gate(round_number: int) -> None:
        begun = heartbeats(recorder)
        try:
            wait_until(lambda: heartbeats(recorder) >= begun + BEATS, WAIT_S, "heartbeats while training")
            opened = True
        except AssertionError:
            opened = False
        engine = service.engine
        seen[round_number] = (opened, engine.parts.registry.is_online(AGENT, engine.parts.clock()))

    worker.gate = gate
    agent_key = SigningKey.generate()  # enrolled as `coordinator enroll` would
    enroll(settings.enrollment_path, AGENT, agent_key.public_key)
    agent = make_agent(tmp_path, mosquitto, worker, exit_when_finished=True, signing_key=agent_key,
                       coordinator_key=load_or_create_signing_key(settings.signing_key_path).public_key)
    stop = threading.Event()
    coordinator_thread = start(service.run, stop, "coordinator")
    agent_thread = start(agent.run, stop, "agent")
    try:
        coordinator_thread.join(2 * WAIT_S + 60)
        assert not coordinator_thread.is_alive(), f"the run did not finish; rounds: {read_rounds(service_log(tmp_path))}"
        agent_thread.join(WAIT_S)
        assert not agent_thread.is_alive(), "the agent did not exit once the run finished"
    finally:
        stop.set()
        coordinator_thread.join(10)
        agent_thread.join(10)

    assert seen == {1: (True, True), 2: (True, True)}  # heartbeats kept flowing; never deemed gone
    rounds = read_rounds(service_log(tmp_path))
    assert [(r["round"], r["outcome"], r["selected"], r["answered"], r["dropouts"]) for r in rounds] == [
        (1, "completed", 1, 1, 0), (2, "completed", 1, 1, 0)]  # selected again in round 2: not deselected
    assert worker.trained == [1, 2] and updates(recorder) == [1, 2]
    assert worker.reads_while_training == 0  # heartbeats never read the worker while it trained


def service_log(tmp_path: Path) -> Path:
    return tmp_path / "coordinator" / "rounds.jsonl"


class Publisher:
    """Plays the coordinator's part on the wire: publishes announcements."""

    def __init__(self, broker: MosquittoBroker) -> None:
        self._client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="announcer",
                                   protocol=paho.MQTTv311)
        self._client.connect(broker.host, broker.port)
        self._client.loop_start()

    def announce(self, round_number: int) -> None:
        info = self._client.publish(TOPICS.rounds_current, encode_message(announce("fedavg", round_number, epochs=1)),
                                    qos=1, retain=True)
        info.wait_for_publish(30)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


@pytest.fixture
def publisher(mosquitto: MosquittoBroker) -> Iterator[Publisher]:
    publisher = Publisher(mosquitto)
    yield publisher
    publisher.close()


def test_the_agent_listens_while_training_and_stops_without_waiting_for_it(
        tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder, worker: GatedWorker,
        publisher: Publisher) -> None:
    released = {1: threading.Event(), 2: threading.Event()}
    training = {1: threading.Event(), 2: threading.Event()}

    def gate(round_number: int) -> None:
        training[round_number].set()
        released[round_number].wait(WAIT_S)

    worker.gate = gate
    agent = make_agent(tmp_path, mosquitto, worker)
    stop = threading.Event()
    agent_thread = start(agent.run, stop, "agent")
    try:
        wait_until(lambda: heartbeats(recorder) >= 1, WAIT_S, "the agent's first heartbeat")
        publisher.announce(1)
        assert training[1].wait(WAIT_S)
        begun = heartbeats(recorder)
        publisher.announce(2)  # heard while round 1 trains; taken once round 1 is done
        wait_until(lambda: agent.announcement is not None and agent.announcement.round == 2, WAIT_S,
                   "the loop to take in round 2's announcement")
        wait_until(lambda: heartbeats(recorder) >= begun + 3, WAIT_S, "heartbeats while round 1 trains")
        assert updates(recorder) == [] and worker.trained == []
        released[1].set()
        assert training[2].wait(WAIT_S)  # round 1 sent, round 2 started on the training thread
        wait_until(lambda: updates(recorder) == [1], WAIT_S, "round 1's update")

        stop.set()  # while round 2 trains, held at its gate: the agent stops without waiting for it
        agent_thread.join(WAIT_S)
        assert not agent_thread.is_alive(), "the agent waited for the training to end"
        wait_until(lambda: any(decode_wire(m.payload, AgentStatus).state == "offline" for m in recorder.snapshot(
            lambda m: m.topic == TOPICS.agent_status(AGENT) and m.payload != b"")), WAIT_S, "the offline status")
        assert worker.trained == [1]
        assert AgentStateDir(tmp_path / "agent").read_json("progress") == {"run_id": "run-1", "round": 1}
    finally:
        stop.set()
        for event in released.values():
            event.set()
        agent_thread.join(10)
    trainer = agent._trainer
    assert trainer is not None and trainer.join(WAIT_S)  # round 2 ran to its end after the stop...
    assert worker.trained == [1, 2] and updates(recorder) == [1]  # ...and its outcome was dropped
    assert AgentStateDir(tmp_path / "agent").read_json("progress") == {"run_id": "run-1", "round": 1}
    assert worker.reads_while_training == 0
