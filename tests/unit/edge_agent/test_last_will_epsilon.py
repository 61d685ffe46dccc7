"""The agent's last will is built once, when ``run`` creates its MQTT link: it carried the privacy spend of process
start, so a device losing power after spending made the broker publish an epsilon below what the agent had reported,
and the coordinator's rollback check stopped selecting it. The will now carries no privacy figure unless the budget
is already spent (and the coordinator ignores an offline status's figure). Found in review."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import edge_agent.agent as agent_module
from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings
from protocol.limits import DecodeLimits
from protocol.messages import AgentStatus, Update
from protocol.security.trust import OPEN, decode_trusted
from protocol.wire import encode_message
from tests.unit.edge_agent.test_dp_agent import announce, start


class RecordingLink:
    """Stands in for MqttLink (the transport, not the code under test): keeps the will it was built with, as the
    real one does in ``_will``, and hands the agent the messages the test delivers."""

    instances: list[RecordingLink] = []

    def __init__(self, client_id: str, address: Any, on_message: Any, *, will: Any = None, on_connected: Any = None,
                 **_: Any) -> None:
        self._will = will
        self.on_message = on_message
        self.on_connected = on_connected
        self.published: list[tuple[str, bytes]] = []
        self.connected = True
        self.reconnects = self.denials = 0
        RecordingLink.instances.append(self)

    def start(self) -> None:
        self.on_connected(None)

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        self.published.append((topic, payload))

    def stop(self, timeout_s: float = 5.0) -> None:
        self.connected = False


def test_the_last_will_never_reports_less_epsilon_than_the_agent_has_spent(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "MqttLink", RecordingLink)
    agent = build_agent(AgentSettings(device="phone", agent_id="dp-agent", state_dir=tmp_path, partition="iid",
                                      num_partitions=10, dp=True, dp_noise_multiplier=1.0, dp_budget_epsilon=100.0),
                        set_threads=False)
    agent.signing_key = None  # unsigned messages: decoded below without the agent's key
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    runner.start()
    while not RecordingLink.instances:
        time.sleep(0.01)
    link = RecordingLink.instances[-1]
    state = start()
    link.on_message(agent.topics.global_state("mlp_tiny", state.round), encode_message(state), True)
    link.on_message(agent.topics.rounds_current, encode_message(announce(2)), False)
    deadline = time.monotonic() + 120
    while not any("/updates/" in t for t, _ in link.published) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    runner.join(30)
    sent = [p for t, p in link.published if "/updates/" in t]
    assert sent, "no update was published"
    update = decode_trusted(sent[0], Update, DecodeLimits(), OPEN).message
    assert update.privacy is not None and update.privacy.epsilon > 0
    will = decode_trusted(link._will.payload, AgentStatus, DecodeLimits(), OPEN).message
    # The will goes out if the device dies now, after this update was published.
    assert will.privacy is None or will.privacy.epsilon >= update.privacy.epsilon, (
        f"last will reports epsilon {will.privacy.epsilon:.4g}, the update already reported "
        f"{update.privacy.epsilon:.4g}")
