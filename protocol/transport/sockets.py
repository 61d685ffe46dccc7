"""TCP settings of an MQTT connection.

MQTT is a request-response protocol of small packets (PUBACK, SUBACK, a status, an announcement) between
large ones. With Nagle's algorithm on, a small packet written while an earlier one is still unacknowledged
waits for that acknowledgement, which the other side's delayed-ACK timer holds back for up to 40 ms on
Linux. A round crosses several such hops, so a small model's round spent most of its time waiting:
6 agents x 1,000 parameters took 88 ms a round with Nagle on at both ends (``bench/scale.py --part long``,
2026-12-03), 48 ms with it off at the broker only. paho leaves Nagle on; the broker turns it off for its
side with ``set_tcp_nodelay true`` (``launcher/broker.py``, ``deploy/mosquitto``, the charts).
"""

from __future__ import annotations

import socket

import paho.mqtt.client as paho


def disable_nagle(client: paho.Client) -> bool:
    """TCP_NODELAY on ``client``'s connected socket; False when it has no TCP socket to set it on."""
    sock = client.socket()
    # A TLS socket is a socket.socket; paho's websocket wrapper is not, and sends whole frames anyway.
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return True
