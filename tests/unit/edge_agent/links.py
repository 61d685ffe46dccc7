"""A stand-in for an agent's MQTT link (no torch: agent tests that need none stay light)."""

from __future__ import annotations


class FakeLink:
    """Records what an agent publishes, in place of its MQTT link."""

    connected = True
    reconnects = 0
    denials = 0

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> None:
        self.published.append((topic, payload))

    def updates(self) -> list[str]:
        return [topic for topic, _ in self.published if "/updates/" in topic]
