"""What the broker refused: MQTT 5 acknowledgements with a reason code of 0x80 or above.

Over MQTT 5 a broker answers every QoS 1 publish with a PUBACK and every subscription with a
SUBACK that carry a reason code; 0x80 and above is a refusal (0x87 "Not authorized" is what an
ACL gives). MQTT 3.1.1 has no reason code in PUBACK: a broker acknowledges a publish it dropped
exactly like one it delivered, so there a refused publish cannot be seen by the client.

``AckTracker`` matches acknowledgements to what was sent (paho reports only the packet id) and
turns refusals into ``Denial`` values; it logs the first refusal of each kind and counts all.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from paho.mqtt.reasoncodes import ReasonCode

log = logging.getLogger("protocol.transport.mqtt")

Action = Literal["publish", "subscribe"]


@dataclass(frozen=True)
class Denial:
    """One publish or subscription the broker refused."""

    action: Action
    topic: str
    """The topic published to, or the topic filter subscribed to."""
    code: int
    """The MQTT 5 reason code, 0x80 or above (0x87: not authorized)."""
    reason: str
    """Its name, as paho gives it (e.g. "Not authorized")."""

    def __str__(self) -> str:
        return f"{self.action} to {self.topic} refused: {self.reason} (0x{self.code:02X})"


def is_refusal(code: ReasonCode) -> bool:
    """Reason codes of 0x80 and above are failures; below (0x10 "No matching subscribers" too) success."""
    return code.value >= 0x80


class AckTracker:
    """Topics of messages and subscriptions in flight, by packet id, until the broker answers them.

    ``sent`` runs on the publishing thread after paho queued a message and ``published`` on the
    network thread when its PUBACK arrives; the PUBACK may be handled first (the network thread
    can run between paho's queueing and ``sent``), so an answer for an id not yet known is kept
    until ``sent`` claims it. No lock of paho's is ever taken under this tracker's lock.
    """

    def __init__(self, on_denied: Callable[[Denial], None] | None = None, *, who: str = "the broker") -> None:
        self.who = who
        """Named in the log line (the broker's address)."""
        self.denials = 0
        """Refusals so far, of publishes and subscriptions together."""
        self._on_denied = on_denied
        self._lock = threading.Lock()
        self._topics: dict[int, str] = {}
        self._early: dict[int, ReasonCode] = {}
        self._subscriptions: dict[int, str] = {}
        self._kinds: Counter[tuple[Action, int]] = Counter()

    def sent(self, mid: int, topic: str) -> None:
        """A QoS 1 message was queued as packet ``mid``."""
        with self._lock:
            early = self._early.pop(mid, None)
            if early is None:
                self._topics[mid] = topic
        if early is not None and is_refusal(early):
            self._deny("publish", topic, early)

    def published(self, mid: int, code: ReasonCode) -> None:
        """The broker acknowledged packet ``mid`` with ``code``."""
        with self._lock:
            topic = self._topics.pop(mid, None)
            if topic is None:
                self._early[mid] = code
                return
        if is_refusal(code):
            self._deny("publish", topic, code)

    def subscribing(self, mid: int, topic_filter: str) -> None:
        """A SUBSCRIBE for one topic filter went out as packet ``mid`` (network thread: answered after)."""
        with self._lock:
            self._subscriptions[mid] = topic_filter

    def subscribed(self, mid: int, codes: Sequence[ReasonCode]) -> None:
        """The SUBACK of packet ``mid``: one code per topic filter (ours subscribe one at a time)."""
        with self._lock:
            topic_filter = self._subscriptions.pop(mid, "?")
        for code in codes:
            if is_refusal(code):
                self._deny("subscribe", topic_filter, code)

    def forget(self) -> None:
        """A new paho client: packet ids start over."""
        with self._lock:
            self._topics.clear()
            self._early.clear()
            self._subscriptions.clear()

    def _deny(self, action: Action, topic: str, code: ReasonCode) -> None:
        denial = Denial(action, topic, code.value, code.getName())
        with self._lock:
            self.denials += 1
            self._kinds[(action, denial.code)] += 1
            first = self._kinds[(action, denial.code)] == 1
        if first:
            log.error("%s: %s; further %s refusals for this reason are only counted", self.who, denial, action)
        if self._on_denied is not None:
            self._on_denied(denial)
