"""Device identity by client certificate, over a real Mosquitto with a TLS-only listener.

A throwaway CA issues the broker's certificate (for localhost and 127.0.0.1) and the clients'
(CN = agent id, and "coordinator"). Mosquitto requires a client certificate from that CA, takes
the certificate's CN as the username (use_identity_as_username) and the username as the client
id, and applies deploy/mosquitto/acl pinned to this federation: the chart's setup with
mosquitto.tls.requireClientCertificate.

A publish the ACL denies is acknowledged and dropped (Mosquitto 2.0.11 also closes the
connection, which the link reopens), so each "never arrives" check ends with an allowed
publish from the same client: once that sentinel is seen, anything let through before it
would have been seen.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.topics import Topics
from protocol.transport.mqtt import Backoff, BrokerAddress, MqttLink
from tests.chart import REPO
from tests.integration.wire import assert_agents_exit_cleanly, assert_all_completed, wait_for_rounds, wait_until
from tests.tls import Issued, TestCA, mtls_listener

pytestmark = pytest.mark.integration

FEDERATION = "tls-fleet"
TOPICS = Topics(FEDERATION)
CLIENTS = ("coordinator", "agent-a", "agent-b", "phone-0", "rpi-1")


class Pki:
    def __init__(self, directory: Path) -> None:
        self.ca = TestCA(directory / "ca")
        self.server = self.ca.server("localhost", "127.0.0.1")
        self.clients = {name: self.ca.client(name) for name in CLIENTS}
        self.other_ca = TestCA(directory / "other", "another CA")
        self.impostor = self.other_ca.client("agent-a")
        """CN agent-a, but from a CA the broker does not trust."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def pinned_acl(federation: str) -> str:
    """deploy/mosquitto/acl for one federation, the way its header says (what the chart renders)."""
    return "".join(line if line.startswith("#") else line.replace("fl/default/", f"fl/{federation}/")
                   for line in (REPO / "deploy" / "mosquitto" / "acl").read_text().splitlines(keepends=True))


@pytest.fixture
def broker(tmp_path: Path, pki: Pki) -> Iterator[MosquittoBroker]:
    """Mosquitto with a single listener, TLS only, that requires a client certificate from our CA."""
    acl = tmp_path / "acl"
    acl.write_text(pinned_acl(FEDERATION))
    port = free_port()
    settings = mtls_listener(port, pki.ca, pki.server, acl)
    with MosquittoBroker(port, workdir=tmp_path / "broker", settings=settings) as running:
        yield running


def url(broker: MosquittoBroker, host: str = "127.0.0.1", credentials: str = "") -> str:
    return f"mqtts://{credentials}{host}:{broker.port}"


class Link:
    """An ``MqttLink`` that records what it receives."""

    def __init__(self, address: BrokerAddress, client_id: str, subscriptions: list[str]) -> None:
        self.received: list[str] = []
        self._lock = threading.Lock()
        self.link = MqttLink(client_id, address, self._on_message, subscriptions=[(s, 1) for s in subscriptions],
                             backoff=Backoff(0.05, 0.5))
        self.link.start()
        wait_until(lambda: self.link.connected, 20, f"{client_id} to connect")

    def _on_message(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._lock:
            self.received.append(topic)

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.received)

    def publish(self, topic: str, retain: bool = False) -> None:
        self.link.publish(topic, b"x", retain=retain)

    def stop(self) -> None:
        self.link.stop()


def link(broker: MosquittoBroker, pki: Pki, name: str, subscriptions: list[str], *, client_id: str | None = None,
         credentials: str = "") -> Link:
    issued = pki.clients[name]
    address = BrokerAddress.parse(url(broker, credentials=credentials)).with_tls_files(
        pki.ca.cert_file, issued.cert_file, issued.key_file)
    return Link(address, client_id or name, subscriptions)


def try_connect(broker: MosquittoBroker, ca_file: Path, client: Issued | None, host: str = "127.0.0.1") -> str:
    """"ok" if the broker accepts a CONNECT over TLS with ``client``'s certificate, else why not."""
    probe = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="probe", protocol=paho.MQTTv311)
    probe.tls_set(ca_certs=str(ca_file), certfile=client and str(client.cert_file),
                  keyfile=client and str(client.key_file), cert_reqs=ssl.CERT_REQUIRED)
    answer: list[str] = []
    probe.on_connect = lambda c, u, f, rc, p: answer.append("ok" if not rc.is_failure else str(rc))
    try:
        probe.connect(host, broker.port, keepalive=10)
        deadline = time.monotonic() + 20
        while not answer and time.monotonic() < deadline:
            rc = probe.loop(timeout=0.2)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return f"refused: {rc.name}"
    except (ssl.SSLError, OSError) as exc:
        return f"refused: {exc}"
    finally:
        probe.disconnect()
        probe.socket() and probe.socket().close()
    return answer[0] if answer else "no CONNACK"


def test_a_client_certificate_connects_and_reaches_its_own_topics(broker: MosquittoBroker, pki: Pki) -> None:
    coordinator = link(broker, pki, "coordinator", [TOPICS.all_updates, TOPICS.all_agent_status],
                       client_id=f"coordinator-{FEDERATION}")
    agent = link(broker, pki, "agent-a", [TOPICS.everything])
    try:
        # The coordinator announces a round (retained, so the agent gets it whenever its
        # subscription lands); the agent answers with an update under its own id.
        coordinator.publish(TOPICS.rounds_current, retain=True)
        wait_until(lambda: TOPICS.rounds_current in agent.seen(), 20, "the agent to read the announcement")
        agent.publish(TOPICS.agent_status("agent-a"))
        agent.publish(TOPICS.update("agent-a", 1))
        wait_until(lambda: TOPICS.update("agent-a", 1) in coordinator.seen(), 20, "the agent's update")
        assert coordinator.seen() == [TOPICS.agent_status("agent-a"), TOPICS.update("agent-a", 1)]
        assert agent.link.reconnects == 0 and coordinator.link.reconnects == 0
    finally:
        agent.stop()
        coordinator.stop()


def test_clients_without_a_certificate_from_the_ca_are_refused(broker: MosquittoBroker, pki: Pki) -> None:
    assert try_connect(broker, pki.ca.cert_file, pki.clients["agent-a"]) == "ok"
    # No certificate, or one with the right CN from another CA: the TLS handshake fails.
    assert try_connect(broker, pki.ca.cert_file, None).startswith("refused")
    wait_until(lambda: "peer did not return a certificate" in broker.log_path.read_text(), 20,
               "the broker to log the missing certificate")
    assert try_connect(broker, pki.ca.cert_file, pki.impostor).startswith("refused")
    wait_until(lambda: "certificate verify failed" in broker.log_path.read_text(), 20,
               "the broker to log the untrusted certificate")
    # And the other way round: a client that trusts another CA refuses the broker's certificate.
    refused = try_connect(broker, pki.other_ca.cert_file, pki.clients["agent-a"])
    assert refused.startswith("refused") and "certificate verify failed" in refused, refused
    # The link itself never gets a session without a certificate (it keeps retrying with back-off).
    bare = MqttLink("agent-a", BrokerAddress.parse(url(broker)).with_tls_files(pki.ca.cert_file),
                    lambda *_: None, backoff=Backoff(0.05, 0.2))
    bare.start()
    try:
        assert try_connect(broker, pki.ca.cert_file, pki.clients["agent-b"]) == "ok"  # meanwhile others get in
        assert not bare.connected and bare.connects == 0
    finally:
        bare.stop()


def test_the_identity_is_the_certificates_not_the_client_id_or_username(broker: MosquittoBroker, pki: Pki) -> None:
    coordinator = link(broker, pki, "coordinator", [TOPICS.all_updates, TOPICS.all_agent_status])
    # agent-a's certificate, asking to be agent-b by client id and by username.
    agent = link(broker, pki, "agent-a", [], client_id="agent-b", credentials="agent-b:agent-b-password@")
    try:
        for topic in (TOPICS.update("agent-b", 1), TOPICS.agent_status("agent-b"),
                      "fl/other-federation/updates/agent-a/1", TOPICS.rounds_current):
            agent.publish(topic)
        agent.publish(TOPICS.update("agent-a", 1))  # the sentinel: allowed, and last
        wait_until(lambda: TOPICS.update("agent-a", 1) in coordinator.seen(), 30, "agent-a's own update")
        assert coordinator.seen() == [TOPICS.update("agent-a", 1)]
    finally:
        agent.stop()
        coordinator.stop()


def test_a_coordinator_and_agents_complete_a_run_over_tls(tmp_path: Path, broker: MosquittoBroker, pki: Pki) -> None:
    def tls(name: str) -> dict[str, str]:
        issued = pki.clients[name]
        return {"ca_file": str(pki.ca.cert_file), "cert_file": str(issued.cert_file), "key_file": str(issued.key_file)}

    rounds = 1
    agents = [AgentSpec("phone-0", "phone", 0, tls("phone-0")), AgentSpec("rpi-1", "rpi", 1, tls("rpi-1"))]
    # "localhost": the broker's certificate names it, and the host name is checked.
    fleet = Fleet(tmp_path / "run", url(broker, host="localhost"), FleetSpec(agents=agents, alpha=1.0), {
        "rounds": rounds, "min_available_agents": 2, "min_fit_agents": 2, "local_epochs": 1, **tls("coordinator"),
    }, federation=FEDERATION)
    with fleet:
        log = wait_for_rounds(fleet, rounds + 1, 180)  # the training round and the final evaluation
        assert_agents_exit_cleanly(fleet, 60)
        assert fleet.coordinator.wait(30) == 0, fleet.coordinator.log_tail()
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert_all_completed(log, rounds + 1)
    assert all(r["answered"] == len(agents) for r in log)
