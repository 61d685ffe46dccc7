"""The link's client (lean_publish.LeanClient) receives exactly what was published, through a real Mosquitto.

Messages on both sides of the size where the kept receive buffer starts, one larger than the buffer so far after
smaller ones (it grows), small ones between large ones (a small packet read the paho way between two in place);
QoS 0, 1 and 2, retained and not, MQTT 5 properties and 3.1.1. Every payload is compared after all arrived: one
that were a view of the reused buffer would have been overwritten by then.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from launcher.broker import MosquittoBroker
from protocol.transport.lean_publish import KEPT_FROM, LeanClient
from protocol.transport.mqtt import BrokerAddress, MqttLink

pytestmark = pytest.mark.integration

MESSAGES = [  # (payload size, QoS, retain); the topic and its properties add to the body's size
    (10, 0, False), (KEPT_FROM - 1, 1, True), (KEPT_FROM, 2, False), (70_000, 0, False), (3, 1, False),
    (1_000_000, 1, True), (508_650, 0, False),  # the second into the buffer the first's payload came from
    (0, 1, False), (2_000_000, 2, False), (70_001, 1, False), (65, 0, True),
]


def _client(cls: type[paho.Client], name: str, v5: bool) -> paho.Client:
    return cls(callback_api_version=CallbackAPIVersion.VERSION2, client_id=name,
               protocol=paho.MQTTv5 if v5 else paho.MQTTv311)


@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
def test_every_message_arrives_whole_and_unchanged(tmp_path: Path, v5: bool) -> None:
    rng = random.Random(5)
    sent = [(f"t/{i}", rng.randbytes(size), qos, retain) for i, (size, qos, retain) in enumerate(MESSAGES)]
    got: list[paho.MQTTMessage] = []
    subscribed, done = threading.Event(), threading.Event()

    def on_message(c: paho.Client, u: object, message: paho.MQTTMessage) -> None:
        got.append(message)
        if len(got) == len(sent):
            done.set()

    with MosquittoBroker(workdir=tmp_path / "broker") as broker:
        address = BrokerAddress.parse(broker.url)
        receiver = _client(LeanClient, "lean-receiver", v5)
        receiver.on_message = on_message
        receiver.on_subscribe = lambda *_: subscribed.set()
        receiver.connect(address.host, address.port)
        receiver.loop_start()
        sender = _client(paho.Client, "sender", v5)
        sender.connect(address.host, address.port)
        sender.loop_start()
        try:
            if v5:  # retain as published: the retain bit reaches a live subscriber too
                receiver.subscribe("t/#", options=SubscribeOptions(qos=2, retainAsPublished=True))
            else:
                receiver.subscribe("t/#", qos=2)
            assert subscribed.wait(30), "the receiver's subscription was never acknowledged"
            for topic, payload, qos, retain in sent:
                properties = None
                if v5:
                    properties = Properties(PacketTypes.PUBLISH)
                    properties.UserProperty = [("n", topic), ("pad", "x" * 200)]
                sender.publish(topic, payload, qos=qos, retain=retain, properties=properties).wait_for_publish(30)
            assert done.wait(60), f"{len(got)} of {len(sent)} messages arrived"
        finally:
            sender.loop_stop()
            receiver.loop_stop()
    by_topic = {message.topic: message for message in got}  # QoS 2 is handed over on PUBREL: later than others
    assert sorted(by_topic) == sorted(topic for topic, *_ in sent)
    for topic, payload, qos, retain in sent:
        message = by_topic[topic]
        assert message.payload == payload, f"{topic}: {len(message.payload)} bytes, {len(payload)} sent"
        assert (message.qos, message.retain) == (qos, retain and v5)  # 3.1.1 clears it for a live subscriber
        if v5:
            assert message.properties is not None and ("n", topic) in message.properties.UserProperty
    assert len(receiver._kept) > 1_000_000  # the large ones went in place (a QoS 2 one does too, then paho's way)


def test_the_link_uses_the_lean_client(tmp_path: Path) -> None:
    with MosquittoBroker(workdir=tmp_path / "broker") as broker:
        link = MqttLink("lean-link", BrokerAddress.parse(broker.url), lambda *_: None)
        assert isinstance(link._client, LeanClient)
