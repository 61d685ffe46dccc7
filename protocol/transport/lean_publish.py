"""Incoming packets read with one copy of a PUBLISH's payload instead of paho's six.

paho-mqtt 2.x receives a packet's body into a new bytes object, appends that to a bytearray,
then decodes a PUBLISH with ``struct.unpack(f"!H{n}s", ...)`` once for the topic's length, once for
the topic, once for the packet id, and slices again for MQTT 5's properties (whose parser slices
the rest of the buffer, payload included, once more per property): a 508 KB update was copied
five times in user space and allocated as often. perf on the coordinator's network thread, the
coordinator on a core of its own at 1,000 agents x 127k: 35% in memmove, another tenth in the
kernel unmapping the freed buffers.

``LeanClient`` replaces two private steps of ``paho.Client`` and nothing else:

* ``_packet_read`` on a plain TCP socket: the fixed header as paho reads it (a byte at a time, so
  a partial header waits for the next call), then a PUBLISH body of 64 KB to 16 MB straight into a
  buffer the client keeps (``recv_into``); paho's own code then handles the packet and resets its
  state. Other packets, TLS and WebSocket connections keep paho's reading;
* ``_handle_publish`` at QoS 0 and 1: topic, packet id and properties are read through a
  memoryview and the payload is one ``bytes`` copy of the rest; the message goes through paho's
  callback dispatch and acknowledgement (``_handle_on_message``, ``_send_puback``, manual acks).
  QoS 2 keeps paho's code. It refuses what paho refuses: an empty topic under 3.1.1, any length
  past the packet's end, properties its parser cannot read (``MalformedPacket``, which paho turns
  into a protocol error and a reconnect).

They are private to paho: ``lean_supported`` checks the installed paho has them in the shape
relied on, and ``MqttLink`` falls back to paho's client when it does not.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.exception import MQTTException
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

try:  # where paho 2.x keeps it; without it the lean path is off (lean_supported)
    from paho.mqtt._packet import MalformedPacket
except ImportError:  # pragma: no cover - another paho layout
    MalformedPacket = None  # type: ignore[assignment,misc]

_BAD_PROPERTIES = (struct.error, IndexError, KeyError, ValueError, MQTTException)
"""What paho's property parser raises on bytes it cannot read (an unknown id, a repeat, bad UTF-8, a value cut
short): paho's own decoding turns them into ``MalformedPacket``, and only that is caught by its reading loop."""
_STEPS = ("_packet_read", "_handle_publish", "_handle_on_message", "_send_puback", "_packet_handle", "_easy_log")
PUBLISH = 0x30
KEPT_FROM = 64 << 10
KEPT_UP_TO = 16 << 20
"""PUBLISH bodies of these sizes are received into one buffer the client keeps (as large as the largest so far), not
a fresh one each (paged in anew whenever glibc had handed the freed one back). Larger ones (a global state of 4M
parameters and more: one a round, not thousands) are read the paho way, so an agent does not keep one more copy of
its model and a header alone never makes the client allocate more than this."""
_RECEIVES_PER_CALL = 100
"""recv_into calls one read may make before the loop gets a turn to write (paho's bound too)."""


def lean_supported() -> bool:
    """The installed paho has the private steps ``LeanClient`` builds on."""
    return (MalformedPacket is not None and callable(getattr(paho, "time_func", None))
            and all(callable(getattr(paho.Client, name, None)) for name in _STEPS))


def parse_publish(header: int, body: bytes | bytearray | memoryview, v5: bool) -> tuple[bytes, int, Properties | None, bytes]:
    """(topic, packet id, properties, payload) of a PUBLISH body (what follows the fixed header); the payload is
    copied once."""
    view = memoryview(body)
    size = len(view)
    if size < 2:
        raise MalformedPacket("a PUBLISH shorter than its topic's length")
    pos = 2 + (view[0] << 8 | view[1])
    if pos > size:
        raise MalformedPacket("the topic runs past the packet")
    topic = bytes(view[2:pos])
    if not v5 and not topic:
        raise MalformedPacket("topic can't be empty in MQTTv3")
    mid = 0
    if header & 0x06:  # QoS 1 or 2: a packet id
        if pos + 2 > size:
            raise MalformedPacket("the packet id runs past the packet")
        mid = view[pos] << 8 | view[pos + 1]
        pos += 2
    properties = None
    if v5:
        length, used = _variable_int(view, pos)
        end = pos + used + length
        if end > size:
            raise MalformedPacket("the properties run past the packet")
        properties = Properties(PacketTypes.PUBLISH)
        try:
            properties.unpack(bytes(view[pos:end]))  # only its own bytes: the parser copies what it gets per property
        except _BAD_PROPERTIES as exc:
            raise MalformedPacket(f"unreadable properties: {exc!r}") from exc
        pos = end
    return topic, mid, properties, bytes(view[pos:])


def _variable_int(view: memoryview, pos: int) -> tuple[int, int]:
    """The MQTT variable byte integer at ``pos``: (value, bytes it takes)."""
    value = 0
    for used in range(1, 5):
        if pos + used > len(view):
            raise MalformedPacket("a variable byte integer runs past the packet")
        byte = view[pos + used - 1]
        value |= (byte & 0x7F) << (7 * (used - 1))
        if not byte & 0x80:
            return value, used
    raise MalformedPacket("a variable byte integer longer than 4 bytes")


class LeanClient(paho.Client):
    """``paho.Client`` that copies incoming payloads once (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kept = bytearray()

    def _packet_read(self) -> MQTTErrorCode:
        sock = self._sock
        if type(sock) is not socket.socket:  # TLS, WebSockets, or no socket: paho's reading
            return super()._packet_read()
        incoming: dict[str, Any] = self._in_packet
        if not incoming["have_remaining"]:
            problem = self._read_fixed_header(sock, incoming)
            if problem is not None:
                return problem
        if incoming["command"] == 0:  # no such packet type; paho, handed this, would read a command byte again
            self._easy_log(paho.MQTT_LOG_ERR, "Error: Unrecognised command 0")
            return MQTTErrorCode.MQTT_ERR_PROTOCOL  # the connection is dropped, and the packet state with it
        if incoming["to_process"] > 0:
            problem = self._read_body(sock, incoming)
            if problem is not None:
                return problem
        return super()._packet_read()  # header and body complete: paho handles the packet and starts the next

    def _read_fixed_header(self, sock: socket.socket, incoming: dict[str, Any]) -> MQTTErrorCode | None:
        """The command byte and the remaining length, a byte a call to recv; None once both are in. As in paho, a
        command byte is read when none is held at the start of a call (so a 0 byte goes on to fail as a command)."""
        need_command = incoming["command"] == 0
        while not incoming["have_remaining"]:
            try:
                byte = sock.recv(1)
            except BlockingIOError:
                return MQTTErrorCode.MQTT_ERR_AGAIN
            except OSError as err:
                self._easy_log(paho.MQTT_LOG_ERR, "failed to receive on socket: %s", err)
                return MQTTErrorCode.MQTT_ERR_CONN_LOST
            if not byte:
                return MQTTErrorCode.MQTT_ERR_CONN_LOST
            if need_command:
                incoming["command"] = byte[0]
                need_command = False
                continue
            digits: list[int] = incoming["remaining_count"]
            digits.append(byte[0])
            if len(digits) > 4:  # the remaining length takes at most 4 bytes
                return MQTTErrorCode.MQTT_ERR_PROTOCOL
            incoming["remaining_length"] += (byte[0] & 0x7F) * incoming["remaining_mult"]
            incoming["remaining_mult"] *= 128
            if not byte[0] & 0x80:
                incoming["have_remaining"] = 1
                incoming["to_process"] = incoming["remaining_length"]
        return None

    def _read_body(self, sock: socket.socket, incoming: dict[str, Any]) -> MQTTErrorCode | None:
        """A large PUBLISH's body received into the client's kept buffer; None once it is all in. Other packets (and
        a body paho began) are paho's to read."""
        packet = incoming["packet"]
        total = incoming["remaining_length"]
        if not isinstance(packet, memoryview):
            if packet or incoming["command"] & 0xF0 != PUBLISH or not KEPT_FROM <= total <= KEPT_UP_TO:
                return super()._packet_read()  # paho's buffer grows as bytes come: a header alone allocates nothing
            if len(self._kept) < total:
                self._kept = bytearray(total)  # a new one: views of the old may still be alive
            packet = memoryview(self._kept)[:total]
            incoming["packet"] = packet
        for _ in range(_RECEIVES_PER_CALL):
            try:
                got = sock.recv_into(packet[total - incoming["to_process"]:])
            except BlockingIOError:
                return MQTTErrorCode.MQTT_ERR_AGAIN
            except OSError as err:
                self._easy_log(paho.MQTT_LOG_ERR, "failed to receive on socket: %s", err)
                return MQTTErrorCode.MQTT_ERR_CONN_LOST
            if got == 0:
                return MQTTErrorCode.MQTT_ERR_CONN_LOST
            incoming["to_process"] -= got
            with self._msgtime_mutex:
                self._last_bytes_received = paho.time_func()
            if incoming["to_process"] == 0:
                return None
        return MQTTErrorCode.MQTT_ERR_AGAIN

    def _handle_publish(self) -> MQTTErrorCode:
        header = self._in_packet["command"]
        qos = (header & 0x06) >> 1
        if qos > 1:  # paho's code, on a buffer of its own kind (a body received in place is a view of the kept one)
            if isinstance(self._in_packet["packet"], memoryview):
                self._in_packet["packet"] = bytearray(self._in_packet["packet"])
            return super()._handle_publish()
        topic, mid, properties, payload = parse_publish(header, self._in_packet["packet"],
                                                        self._protocol == MQTTProtocolVersion.MQTTv5)
        message = paho.MQTTMessage(mid=mid, topic=topic)
        message.dup = bool(header & 0x08)
        message.qos = qos
        message.retain = bool(header & 0x01)
        message.properties = properties
        message.payload = payload
        message.timestamp = paho.time_func()
        self._easy_log(paho.MQTT_LOG_DEBUG, "Received PUBLISH (d%d, q%d, r%d, m%d), '%s', ...  (%d bytes)",
                       message.dup, qos, message.retain, mid, topic, len(payload))
        self._handle_on_message(message)
        if qos == 1 and not self._manual_ack:
            return self._send_puback(mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS
