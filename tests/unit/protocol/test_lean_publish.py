"""parse_publish reads what paho's decode_publish reads, refuses what it refuses, and copies the payload out."""

from __future__ import annotations

import itertools
import random
import socket

import paho.mqtt.client as paho
import pytest
from paho.mqtt import _packet as paho_packet
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from protocol.transport.lean_publish import LeanClient, MalformedPacket, lean_supported, parse_publish


def _properties(kind: str) -> Properties | None:
    if kind == "none":
        return None
    props = Properties(PacketTypes.PUBLISH)
    if kind == "several":
        props.UserProperty = [("run", "r-1"), ("k", "v" * 300)]  # a value past 127 bytes: multi-byte lengths
        props.ContentType = "application/msgpack"
        props.MessageExpiryInterval = 3600
    return props


def _body(topic: bytes, qos: int, mid: int, v5: bool, props: Properties | None, payload: bytes) -> bytes:
    """A PUBLISH's variable header and payload, written from the MQTT specification (sections 3.3.2 and 3.3.3)."""
    out = len(topic).to_bytes(2, "big") + topic
    if qos:
        out += mid.to_bytes(2, "big")
    if v5:
        out += (props or Properties(PacketTypes.PUBLISH)).pack()
    return out + payload


def _header(qos: int, retain: bool = False, dup: bool = False) -> int:
    return 0x30 | (0x08 if dup else 0) | qos << 1 | (0x01 if retain else 0)


CASES = list(itertools.product((True, False), (0, 1, 2), ("none", "empty", "several"), (0, 1, 70_000)))


@pytest.mark.parametrize(("v5", "qos", "props", "size"), CASES)
def test_it_reads_what_paho_reads(v5: bool, qos: int, props: str, size: int) -> None:
    payload = random.Random(size).randbytes(size)
    properties = _properties(props) if v5 else None
    body = _body(b"fl/fed/updates/agent-7/3", qos, 4242, v5, properties, payload)
    version = MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311
    theirs = paho_packet.decode_publish(_header(qos, retain=True), bytearray(body), version)
    topic, mid, ours_props, ours_payload = parse_publish(_header(qos, retain=True), bytearray(body), v5)
    assert (topic, mid, ours_payload) == (theirs.topic, theirs.mid, theirs.payload)
    assert type(ours_payload) is bytes
    if v5:
        assert ours_props is not None and theirs.properties is not None
        assert ours_props.pack() == theirs.properties.pack()
        assert ours_props.json() == theirs.properties.json()
    else:
        assert ours_props is None and theirs.properties is None


def test_the_payload_is_a_copy_the_buffer_cannot_change() -> None:
    buffer = bytearray(_body(b"t/x", 1, 7, True, None, b"abc" * 30_000))
    _, _, _, payload = parse_publish(_header(1), memoryview(buffer), True)
    buffer[-90_000:] = bytes(90_000)
    assert payload == b"abc" * 30_000


@pytest.mark.parametrize("v5", [True, False])
def test_every_truncation_is_a_malformed_packet(v5: bool) -> None:
    """Cut inside the topic's length, the topic, the packet id or the properties: refused, never read past."""
    payload_free = _body(b"fl/fed/updates/a/1", 1, 9, v5, _properties("several") if v5 else None, b"")
    for cut in range(len(payload_free)):
        with pytest.raises(MalformedPacket):
            parse_publish(_header(1), payload_free[:cut], v5)
    assert parse_publish(_header(1), payload_free, v5)[3] == b""  # whole: an empty payload is fine


def test_an_empty_topic_is_refused_under_311_as_paho_refuses_it() -> None:
    body = _body(b"", 0, 0, False, None, b"x")
    with pytest.raises(MalformedPacket):
        parse_publish(_header(0), body, False)
    with pytest.raises(MalformedPacket):
        paho_packet.decode_publish(_header(0), bytearray(body), MQTTProtocolVersion.MQTTv311)
    assert parse_publish(_header(0), _body(b"", 0, 0, True, None, b"x"), True)[0] == b""  # 5: a topic alias may stand in


def test_a_properties_length_of_five_bytes_is_refused() -> None:
    body = _body(b"t", 0, 0, False, None, b"") + bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x01]) + b"payload"
    with pytest.raises(MalformedPacket, match="longer than 4 bytes"):
        parse_publish(_header(0), body, True)


def test_the_installed_paho_has_what_the_lean_client_builds_on() -> None:
    """The project's pinned paho (deploy/coordinator/requirements.txt): if this fails after an upgrade, MqttLink has
    quietly gone back to paho's copying client; read lean_publish.py against the new paho before changing this."""
    assert lean_supported()


def _v5_body(properties: bytes, payload: bytes = b"p") -> bytes:
    """A QoS 0 PUBLISH body on topic "t" whose properties section is ``properties`` (its length prefixed)."""
    assert len(properties) < 128
    return b"\x00\x01t" + bytes([len(properties)]) + properties + payload


UNREADABLE_PROPERTIES = {
    "an unknown property id": b"\x7f\x00",
    "a property given twice": b"\x01\x00\x01\x00",  # payload format indicator, twice
    "a string that is not UTF-8": b"\x03\x00\x02\xff\xfe",  # content type
    "a four-byte integer cut short": b"\x02\x00\x00",  # message expiry interval, 2 of its 4 bytes
}


@pytest.mark.parametrize("properties", UNREADABLE_PROPERTIES.values(), ids=UNREADABLE_PROPERTIES.keys())
def test_unreadable_properties_are_a_malformed_packet(properties: bytes) -> None:
    """paho's decoding turns its property parser's errors into MalformedPacket, the one error its reading loop
    catches (a protocol error and a reconnect); anything else would end the network thread."""
    with pytest.raises(MalformedPacket, match="unreadable properties"):
        parse_publish(_header(0), _v5_body(properties), True)
    with pytest.raises(MalformedPacket):
        paho_packet.decode_publish(_header(0), bytearray(_v5_body(properties)), MQTTProtocolVersion.MQTTv5)


def _read_with(cls: type[paho.Client], data: bytes) -> tuple[MQTTErrorCode, list[bytes]]:
    """``data`` arriving on a connected socket of a client of ``cls``: what one read returns, and the payloads its
    on_message got."""
    client = cls(callback_api_version=CallbackAPIVersion.VERSION2, client_id="reader", protocol=paho.MQTTv5)
    got: list[bytes] = []
    client.on_message = lambda c, u, message: got.append(message.payload)
    mine, theirs = socket.socketpair()
    with mine, theirs:
        mine.setblocking(False)
        client._sock = mine  # what connect() leaves: a plain socket the client reads from
        theirs.sendall(data)
        return client._packet_read(), got


def _packet(body: bytes) -> bytes:
    """A QoS 0 PUBLISH packet: its fixed header (the remaining length as a variable byte integer) and ``body``."""
    length, digits = len(body), bytearray()
    while True:
        length, digit = divmod(length, 128)
        digits.append(digit | (0x80 if length else 0))
        if not length:
            return bytes([0x30]) + bytes(digits) + body


BYTES_IN = {
    "a command byte of 0": (b"\x00\x00", MQTTErrorCode.MQTT_ERR_PROTOCOL, []),
    "unreadable properties": (_packet(_v5_body(b"\x7f\x00")), MQTTErrorCode.MQTT_ERR_PROTOCOL, []),
    "a small publish": (_packet(_v5_body(b"\x01\x00")), MQTTErrorCode.MQTT_ERR_SUCCESS, [b"p"]),
    "a large publish": (_packet(_v5_body(b"", bytes(66_561))), MQTTErrorCode.MQTT_ERR_SUCCESS, [bytes(66_561)]),
}


@pytest.mark.parametrize(("data", "rc", "payloads"), BYTES_IN.values(), ids=BYTES_IN.keys())
def test_a_read_ends_as_pahos_does(data: bytes, rc: MQTTErrorCode, payloads: list[bytes]) -> None:
    """The same bytes on the socket: the same return code and the same messages from paho's client and the lean one
    (a protocol error is paho's signal to drop the connection and reconnect)."""
    assert _read_with(paho.Client, data) == (rc, payloads)
    assert _read_with(LeanClient, data) == (rc, payloads)
