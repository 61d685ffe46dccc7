"""The link over MQTT 5 and 3.1.1, against real brokers: a real Mosquitto (MQTT 5) with an ACL, and the
embedded amqtt broker (3.1.1 only).

Over MQTT 5 Mosquitto answers a publish its ACL refuses with PUBACK reason code 0x87, and the link
reports it; over 3.1.1 the same publish is acknowledged like any other (Mosquitto 2.0.11 then also
closes the connection, and the link reconnects). Each check that something did not happen ends
with an allowed publish from the same client, seen by a receiver: messages of one client arrive
in order, so once the sentinel is there anything before it has been handled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.broker import EmbeddedBroker, MosquittoBroker
from protocol.transport.acks import Denial
from protocol.transport.mqtt import Backoff, BrokerAddress, Connection, MqttLink
from tests.integration.wire import wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0


class Inbox:
    """What a link received, in order."""

    def __init__(self) -> None:
        self.topics: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, topic: str, payload: bytes, retained: bool) -> None:
        with self._lock:
            self.topics.append(topic)

    def seen(self) -> list[str]:
        with self._lock:
            return list(self.topics)


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """Mosquitto whose ACL lets each client write only under ok/<client id>/, and read ok/#."""
    acl = tmp_path / "acl"
    acl.write_text("pattern write ok/%c/#\npattern read ok/#\n")
    with MosquittoBroker(workdir=tmp_path / "broker", settings=f"acl_file {acl}\nmax_inflight_messages 10\n") as b:
        yield b


def start(link: MqttLink) -> MqttLink:
    link.start()
    assert link.wait_connected(TIMEOUT_S), f"{link.client_id} did not connect"
    return link


def test_mqtt5_shows_a_publish_the_acl_refuses(acl_broker: MosquittoBroker) -> None:
    address = BrokerAddress.parse(acl_broker.url)
    inbox, denied = Inbox(), list[Denial]()
    receiver = start(MqttLink("receiver", address, inbox, subscriptions=[("ok/#", 1)], backoff=Backoff(0.05, 0.2)))
    sender = start(MqttLink("sender", address, lambda *_: None, on_denied=denied.append, backoff=Backoff(0.05, 0.2)))
    try:
        assert sender.version == "5" and receiver.version == "5"
        sender.publish("ok/receiver/1", b"not mine")
        sender.publish("ok/sender/1", b"mine")
        wait_until(lambda: "ok/sender/1" in inbox.seen(), TIMEOUT_S, "the allowed publish")
        wait_until(lambda: sender.denials == 1, TIMEOUT_S, "the refusal")
        assert denied == [Denial("publish", "ok/receiver/1", 0x87, "Not authorized")]
        assert inbox.seen() == ["ok/sender/1"]
    finally:
        sender.stop()
        receiver.stop()


def test_mqtt311_cannot_see_it(acl_broker: MosquittoBroker, caplog: pytest.LogCaptureFixture) -> None:
    address = BrokerAddress.parse(acl_broker.url).with_mqtt_version("3.1.1")
    inbox, denied = Inbox(), list[Denial]()
    with caplog.at_level(logging.INFO, logger="protocol.transport.mqtt"):
        receiver = start(MqttLink("receiver", address, inbox, subscriptions=[("ok/#", 1)],
                                  backoff=Backoff(0.05, 0.2)))
        sender = start(MqttLink("sender", address, lambda *_: None, on_denied=denied.append,
                                backoff=Backoff(0.05, 0.2)))
    try:
        assert sender.version == "3.1.1"
        sender.publish("ok/receiver/1", b"not mine")
        sender.publish("ok/sender/1", b"mine")
        wait_until(lambda: "ok/sender/1" in inbox.seen(), TIMEOUT_S, "the allowed publish")
        assert denied == [] and sender.denials == 0 and inbox.seen() == ["ok/sender/1"]
        said = [r.getMessage() for r in caplog.records if "speaks MQTT 3.1.1" in r.getMessage()]
        assert len(said) == 2 and all("cannot see it" in line for line in said), said  # one line per link
    finally:
        sender.stop()
        receiver.stop()


def test_qos1_bursts_pass_a_smaller_receive_maximum(acl_broker: MosquittoBroker) -> None:
    """The broker announces Receive Maximum 10 (max_inflight_messages); the link keeps its window of 1000."""
    address = BrokerAddress.parse(acl_broker.url)
    inbox = Inbox()
    receiver = start(MqttLink("receiver", address, inbox, subscriptions=[("ok/#", 1)]))
    sender = start(MqttLink("sender", address, lambda *_: None))
    try:
        for i in range(500):
            sender.publish(f"ok/sender/{i}", bytes(1000))
        wait_until(lambda: len(inbox.seen()) >= 500, TIMEOUT_S * 2, "the burst")
        assert sorted(inbox.seen()) == sorted(f"ok/sender/{i}" for i in range(500))
        assert sender.reconnects == 0 and sender.denials == 0
    finally:
        sender.stop()
        receiver.stop()


def test_a_persistent_session_keeps_what_was_queued_while_away(tmp_path: Path) -> None:
    """The coordinator's session over MQTT 5: clean start false, never expiring, as 3.1.1's clean_session false."""
    with MosquittoBroker(workdir=tmp_path / "broker") as broker:
        address = BrokerAddress.parse(broker.url)
        connections: list[Connection] = []
        inbox = Inbox()

        def persistent() -> MqttLink:
            return MqttLink("coordinator-f", address, inbox, subscriptions=[("q/#", 1)], persistent_session=True,
                            on_connected=connections.append)

        first = start(persistent())
        publisher = start(MqttLink("agent", address, lambda *_: None))
        try:
            publisher.publish("q/0", b"while here")
            wait_until(lambda: inbox.seen() == ["q/0"], TIMEOUT_S, "the first message")
            first.stop()
            for i in (1, 2, 3):  # acknowledged: the broker holds them for the absent session
                publisher.publish(f"q/{i}", b"while away").wait_for_publish(TIMEOUT_S)
            second = start(persistent())  # a new process, the same client id
            wait_until(lambda: inbox.seen() == ["q/0", "q/1", "q/2", "q/3"], TIMEOUT_S, "the queued messages")
            assert [c.session_present for c in connections] == [False, True]
            second.stop()
        finally:
            publisher.stop()


def test_a_broker_that_refuses_mqtt5_gets_311(caplog: pytest.LogCaptureFixture) -> None:
    """amqtt answers an MQTT 5 CONNECT with "unsupported protocol version": with auto, the link falls back,
    and what was published before the fallback still goes out."""
    with EmbeddedBroker() as broker, caplog.at_level(logging.INFO, logger="protocol.transport.mqtt"):
        address = BrokerAddress.parse(broker.url)
        inbox = Inbox()
        receiver = start(MqttLink("receiver", address.with_mqtt_version("3.1.1"), inbox,
                                  subscriptions=[("fb/#", 1)]))
        link = MqttLink("auto", address, lambda *_: None, backoff=Backoff(0.05, 0.2))
        link.publish("fb/early", b"published before the first connect")
        try:
            start(link)
            assert link.version == "3.1.1" and link.connects == 1
            link.publish("fb/late", b"after")
            wait_until(lambda: inbox.seen() == ["fb/early", "fb/late"], TIMEOUT_S, "both messages")
            fell_back = [r for r in caplog.records if "refused MQTT 5" in r.getMessage()]
            assert len(fell_back) == 1 and fell_back[0].levelno == logging.WARNING
            assert "cannot see it" in fell_back[0].getMessage()
        finally:
            link.stop()
            receiver.stop()


def test_mqtt5_required_stays_refused_by_a_311_broker(caplog: pytest.LogCaptureFixture) -> None:
    with EmbeddedBroker() as broker, caplog.at_level(logging.ERROR, logger="protocol.transport.mqtt"):
        link = MqttLink("strict", BrokerAddress.parse(broker.url).with_mqtt_version("5"), lambda *_: None,
                        backoff=Backoff(0.05, 0.2))
        link.start()
        try:
            wait_until(lambda: any("refused the connection of strict" in r.getMessage() for r in caplog.records),
                       TIMEOUT_S, "the refusal to be logged")
            assert link.version == "5" and link.connects == 0
        finally:
            link.stop()
