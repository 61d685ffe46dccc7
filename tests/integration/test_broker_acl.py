"""deploy/mosquitto's config and ACL in a real Mosquitto: each agent is pinned to its own topics.

What crosses the wire is checked with an independent subscriber (the coordinator's user).
Denied QoS 1 publishes are acknowledged and silently dropped by Mosquitto, so each check ends
with an allowed publish from the same client: messages of one client arrive in order, so
once the sentinel is seen, anything the broker let through before it would have been seen.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import free_port, mosquitto_binary, wait_for_port
from tests.chart import REPO
from tests.integration.wire import WireRecorder, wait_until

pytestmark = pytest.mark.integration

DEPLOY = REPO / "deploy" / "mosquitto"
FEDERATION = "f"
USERS = {"coordinator": "coordinator-pw", "jetson-0": "jetson-0-pw", "rpi-1": "rpi-1-pw", "watcher": "watcher-pw"}
WATCHER = "\n# Test only: a user that reads everything, to see what crosses the broker.\nuser watcher\ntopic read #\n"


class Broker:
    def __init__(self, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
        self.port, self.process, self.log = port, process, log

    def url(self, user: str, password: str | None = None) -> str:
        return f"mqtt://{user}:{password or USERS[user]}@127.0.0.1:{self.port}"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """deploy/mosquitto/mosquitto.conf with local paths, a free port and the ACL file as shipped."""
    binary = mosquitto_binary()
    assert binary is not None, "the mosquitto binary is not installed (apt-get install mosquitto)"
    passwd = tmp_path / "passwd"
    passwd.write_text("".join(f"{user}:{password}\n" for user, password in USERS.items()))
    subprocess.run([shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd", "-U", str(passwd)], check=True,
                   timeout=30)
    port = free_port()
    # The ACL as shipped, pinned to federation "f" the way its header says (sed '/^#/!s#fl/default/#fl/f/#').
    acl = tmp_path / "acl"
    acl.write_text("".join(line if line.startswith("#") else line.replace("fl/default/", f"fl/{FEDERATION}/")
                           for line in (DEPLOY / "acl").read_text().splitlines(keepends=True)) + WATCHER)
    yield from run_configured(binary, DEPLOY / "mosquitto.conf", tmp_path, port, {
        "/mosquitto/config/passwd": str(passwd), "/mosquitto/config/acl": str(acl)})


def run_configured(binary: str, config_file: Path, data: Path, port: int,
                   replace: dict[str, str]) -> Iterator[Broker]:
    """Mosquitto on ``config_file`` made local: listening on 127.0.0.1:``port``, its data in ``data``,
    no persistence, running as this user, with ``replace``'s substitutions (each must occur)."""
    config = config_file.read_text()
    for old, new in {"listener 1883\n": f"listener {port} 127.0.0.1\n", "persistence true": "persistence false",
                     "/mosquitto/data/": f"{data}/", **replace}.items():
        assert old in config, old
        config = config.replace(old, new)
    (data / "mosquitto.conf").write_text(config + f"user {getpass.getuser()}\n")
    log = data / "mosquitto.log"
    with log.open("wb") as out:
        process = subprocess.Popen([binary, "-c", str(data / "mosquitto.conf")], stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for_port("127.0.0.1", port, 10), log.read_text()
        yield Broker(port, process, log)
    finally:
        process.terminate()
        process.wait(10)


class Client:
    """A paho client that records its connection result and what it receives."""

    def __init__(self, broker: Broker, user: str | None, password: str | None, client_id: str) -> None:
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=paho.MQTTv311)
        if user is not None:
            self.client.username_pw_set(user, password)
        self.result: str | None = None
        self.received: list[str] = []
        self._answered = threading.Event()
        self._subscribed = threading.Event()
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda c, u, mid, codes, p: self._subscribed.set()
        self.client.on_message = lambda c, u, m: self.received.append(m.topic)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        assert self._answered.wait(10), "no CONNACK"

    def _on_connect(self, client: paho.Client, userdata: object, flags: object, rc: paho.ReasonCode,
                    properties: object) -> None:
        self.result = "ok" if not rc.is_failure else str(rc)
        self._answered.set()

    def subscribe(self, topic_filter: str) -> None:
        self.client.subscribe(topic_filter, qos=1)
        assert self._subscribed.wait(10), "no SUBACK"

    def publish(self, topic: str, payload: bytes = b"x", retain: bool = False) -> None:
        self.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_agents_write_only_their_own_topics(broker: Broker) -> None:
    observer = WireRecorder(broker.url("coordinator"), "fl/#", client_id="coordinator").start()
    try:
        jetson = Client(broker, "jetson-0", USERS["jetson-0"], "jetson-0")
        assert jetson.result == "ok"
        for topic in ("fl/f/updates/rpi-1/1", "fl/f/agents/rpi-1/status", "fl/f/rounds/current",
                      "fl/f/global/cnn_small/2", "fl/f/coordinator/status", "fl/other-kind/jetson-0/1"):
            jetson.publish(topic)
        jetson.publish("fl/f/agents/jetson-0/status")
        jetson.publish("fl/f/updates/jetson-0/1")
        wait_until(lambda: "fl/f/updates/jetson-0/1" in {m.topic for m in observer.snapshot()}, 20, "jetson-0's update")
        jetson.close()

        # Asking for rpi-1's client id does not help: the broker makes the username the client id.
        spoof = Client(broker, "jetson-0", USERS["jetson-0"], "rpi-1")
        assert spoof.result == "ok"
        spoof.publish("fl/f/updates/rpi-1/1")
        spoof.publish("fl/f/updates/jetson-0/2")
        wait_until(lambda: "fl/f/updates/jetson-0/2" in {m.topic for m in observer.snapshot()}, 20, "the sentinel")
        spoof.close()
        seen = [m.topic for m in observer.snapshot()]
        assert sorted(seen) == ["fl/f/agents/jetson-0/status", "fl/f/updates/jetson-0/1", "fl/f/updates/jetson-0/2"]
    finally:
        observer.stop()


def test_agents_cannot_write_into_other_federations(broker: Broker) -> None:
    watcher = WireRecorder(broker.url("watcher"), "#", client_id="watcher").start()
    try:
        jetson = Client(broker, "jetson-0", USERS["jetson-0"], "jetson-0")
        for topic in ("fl/g/updates/jetson-0/1", "fl/g/agents/jetson-0/status", "fl/g/rounds/current"):
            jetson.publish(topic)
        jetson.publish("fl/f/updates/jetson-0/1")  # sentinel
        wait_until(lambda: "fl/f/updates/jetson-0/1" in {m.topic for m in watcher.snapshot()}, 20, "the sentinel")
        jetson.close()
        assert [m.topic for m in watcher.snapshot()] == ["fl/f/updates/jetson-0/1"]
    finally:
        watcher.stop()


def test_agents_read_what_the_coordinator_publishes_and_no_other_agents_updates(broker: Broker) -> None:
    coordinator = Client(broker, "coordinator", USERS["coordinator"], "coordinator")
    rpi = Client(broker, "rpi-1", USERS["rpi-1"], "rpi-1")
    jetson = Client(broker, "jetson-0", USERS["jetson-0"], "jetson-0")
    try:
        jetson.subscribe("fl/#")
        coordinator.publish("fl/f/coordinator/status", retain=True)
        coordinator.publish("fl/f/rounds/current", retain=True)
        coordinator.publish("fl/f/global/cnn_large/1", retain=True)
        rpi.publish("fl/f/updates/rpi-1/1")
        rpi.publish("fl/f/agents/rpi-1/status")
        coordinator.publish("fl/f/rounds/current")  # sentinel, after rpi-1's messages reached the broker
        wait_until(lambda: jetson.received.count("fl/f/rounds/current") >= 2, 20, "the coordinator's messages")
        assert sorted(set(jetson.received)) == ["fl/f/coordinator/status", "fl/f/global/cnn_large/1",
                                                "fl/f/rounds/current"]
    finally:
        for client in (coordinator, rpi, jetson):
            client.close()


def test_unknown_users_and_wrong_passwords_are_refused(broker: Broker) -> None:
    assert Client(broker, "jetson-0", "wrong", "jetson-0").result == "Not authorized"
    assert Client(broker, None, None, "anonymous").result == "Not authorized"
    assert Client(broker, "jetson-9", "jetson-0-pw", "jetson-9").result == "Not authorized"


def test_secure_aggregation_stages_pass_and_stay_with_their_agents(broker: Broker) -> None:
    """Each agent writes only its own stages, reads every relay and only its own share inbox; the coordinator
    reads the stages and writes relays and inboxes (without these lines no secure round could run here)."""
    coordinator = Client(broker, "coordinator", USERS["coordinator"], "coordinator")
    rpi = Client(broker, "rpi-1", USERS["rpi-1"], "rpi-1")
    jetson = Client(broker, "jetson-0", USERS["jetson-0"], "jetson-0")
    try:
        coordinator.subscribe("fl/f/secagg/#")
        jetson.subscribe("fl/#")
        rpi.publish("fl/f/secagg/jetson-0/3/masked")  # not its own: dropped
        rpi.publish("fl/f/secagg_relay/cnn_small/3/keys")  # the coordinator's: dropped
        rpi.publish("fl/f/secagg_inbox/jetson-0/3")  # the coordinator's: dropped
        rpi.publish("fl/f/secagg/rpi-1/3/advertise")
        # Once rpi-1's last message is through, whatever the broker let through of its earlier ones is queued for
        # jetson-0 ahead of anything the coordinator publishes next.
        wait_until(lambda: "fl/f/secagg/rpi-1/3/advertise" in coordinator.received, 20, "rpi-1's advertisement")
        coordinator.publish("fl/f/secagg_inbox/rpi-1/3")  # another agent's bundles: jetson-0 must not read them
        coordinator.publish("fl/f/secagg_inbox/jetson-0/3")
        coordinator.publish("fl/f/secagg_relay/cnn_small/3/keys")  # sentinel: the coordinator's are in order
        wait_until(lambda: "fl/f/secagg_relay/cnn_small/3/keys" in jetson.received, 20, "the relay")
        assert coordinator.received == ["fl/f/secagg/rpi-1/3/advertise"]
        assert sorted(jetson.received) == ["fl/f/secagg_inbox/jetson-0/3", "fl/f/secagg_relay/cnn_small/3/keys"]
    finally:
        for client in (coordinator, rpi, jetson):
            client.close()
