"""The run's task card and refusal notices over a real Mosquitto, with real agent processes.

A hello claiming a wrong layout is retained on the broker before anything starts (so the coordinator
hears it first), and a real agent runs another task (mnist-5k in a digits run). Before the task card
and notices, the first hello pinned its family's layout and the run waited for ever; a refused agent
heard nothing. Now the honest majority fixes the layout, the run completes, the card on the wire
names each family's arrays, and each refused agent gets a signed notice saying why.
"""

from __future__ import annotations

import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.messages import AgentStatus, Notice, TaskAnnouncement
from protocol.topics import Topics
from protocol.wire import encode_message
from tests.integration.wire import (
    WireRecorder,
    assert_all_completed,
    decode_wire,
    fleet_keys,
    retained_messages,
    signer_of,
    wait_for_rounds,
    wait_until,
)
from tests.task_refs import DIGITS, family_layout

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FEDERATION = "cardrun"
TOPICS = Topics(FEDERATION)
ROUNDS = 2


def plant_wrong_hello(url: str) -> None:
    """An agent that says hello with a layout of zeros, retained, before the coordinator starts."""
    host, port = url.removeprefix("mqtt://").split(":")
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="impostor-planter")
    client.connect(host, int(port))
    client.loop_start()
    status = AgentStatus(agent_id="impostor", state="online", device="phone", family="mlp_tiny", num_samples=400,
                         num_eval_samples=40, version="0", timestamp=time.time(), task_ref=DIGITS, layout="0" * 32,
                         session="impostor", epoch=1, seq=1)
    client.publish(TOPICS.agent_status("impostor"), encode_message(status), qos=1, retain=True).wait_for_publish(10)
    client.loop_stop()
    client.disconnect()


def test_a_wrong_first_hello_and_another_task_are_refused_and_told_while_the_run_completes(
        tmp_path: Path, mosquitto: MosquittoBroker) -> None:
    plant_wrong_hello(mosquitto.url)
    agents = [AgentSpec("phone-0", "phone", 0), AgentSpec("phone-1", "phone", 1),
              AgentSpec("phone-x", "phone", 2, {"task": "mnist-5k", "exit_when_finished": False})]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=1.0), {
        "rounds": ROUNDS, "min_available_agents": 2, "min_fit_agents": 2, "local_epochs": 1,
        "http_port": free_port(), "exit_when_finished": False,
        "enrollment": "open",  # the impostor is nobody's enrolled device: with enrollment it would not even get a vote
    }, federation=FEDERATION)
    with WireRecorder(mosquitto.url, f"fl/{FEDERATION}/#", client_id="card-recorder") as recorder, fleet:
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 240)
        told = lambda agent_id: [m for m in recorder.snapshot() if m.topic == TOPICS.notices(agent_id)]  # noqa: E731
        wait_until(lambda: bool(told("phone-x")), 60, "a notice to phone-x")
        wait_until(lambda: bool(told("impostor")), 60, "a notice to the impostor")

        def shows_notice() -> bool:
            retained = retained_messages(mosquitto.url, TOPICS.agent_status("phone-x"), settle_s=0.5)
            payload = retained.get(TOPICS.agent_status("phone-x"))
            return payload is not None and (decode_wire(payload, AgentStatus).notice or "").startswith("task_mismatch")
        wait_until(shows_notice, 60, "phone-x's status showing its notice")
        keys = fleet_keys(fleet)
        card_payload = retained_messages(mosquitto.url, TOPICS.task)[TOPICS.task]
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["selected"] == 2 for r in rounds), rounds  # neither refused agent was ever selected

    for agent_id in ("impostor", "phone-x"):
        first = told(agent_id)[0]
        assert signer_of(first.payload, keys) == "coordinator" and not first.retained
        notice = decode_wire(first.payload, Notice)
        assert (notice.agent_id, notice.reason, notice.about) == (agent_id, "task_mismatch", "status"), notice
    assert "mnist-5k@1" in decode_wire(told("phone-x")[0].payload, Notice).detail

    assert signer_of(card_payload, keys) == "coordinator"
    card = decode_wire(card_payload, TaskAnnouncement).card
    assert card.ref == DIGITS
    mlp = card.layouts["mlp_tiny"]
    assert mlp.fingerprint == family_layout("mlp_tiny") and mlp.arrays  # arrays known once the first state exists

    (phone_x,) = [p for p in fleet.processes() if p.name == "phone-x"]
    assert "the coordinator refused its status: task_mismatch" in phone_x.log_path.read_text()
