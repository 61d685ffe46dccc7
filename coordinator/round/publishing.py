"""Everything the coordinator publishes goes out here: signed, counted, chunked where it must be.

The publisher writes into the engine's ``Actions``; the driver puts them on the broker.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from coordinator.round.actions import Actions, Save
from coordinator.state.retained import RETAINED, RetainedStates
from coordinator.strategies.base import FamilyState
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.compression import raw_bytes
from protocol.messages import CoordinatorStatus, Notice, TaskAnnouncement
from protocol.security.signing import SigningKey
from protocol.topics import Topics
from protocol.transport.chunking import split_payload
from protocol.wire import encode_message


class Publisher:
    def __init__(self, actions: Actions, metrics: CoordinatorMetrics, topics: Topics, retained: RetainedStates,
                 signing_key: SigningKey | None, max_message_bytes: int) -> None:
        self.actions = actions
        self.metrics = metrics
        self.topics = topics
        self.retained = retained
        self.signing_key = signing_key
        """Signs every status, announcement and global state (None: unsigned, engine unit tests)."""
        self.max_message_bytes = max_message_bytes

    def sealed(self, payload: bytes) -> bytes:
        """``payload`` in a signed envelope (deterministic: the same payload seals to the same bytes)."""
        return payload if self.signing_key is None else encode_message(self.signing_key.seal(payload))

    def publish(self, topic: str, payload: bytes, kind: str, *, retain: bool) -> int:
        self.actions.publish(topic, payload, retain=retain)
        self.metrics.bytes_sent.labels(kind).inc(len(payload))
        self.metrics.messages_sent.labels(kind).inc()
        return len(payload)

    def states(self, states: Mapping[str, FamilyState], run_id: str, epoch: int = 0) -> int:
        """Publish (retained) every family state not yet sent on this connection; clear superseded ones."""
        sent = 0
        for family, state in list(states.items()):
            if not self.retained.needs_publishing(family, state.round, state.digest):
                continue
            payload = self.sealed(encode_message(state.message(run_id, family, epoch)))
            pieces = split_payload(payload, self.max_message_bytes, self.signing_key,
                                   self.topics.global_state(family, state.round))
            in_use = self.topics.global_state_topics(family, state.round, len(pieces))
            for topic, piece in zip(in_use, pieces, strict=True):
                sent += self.publish(topic, piece, "global_state", retain=True)
            self.metrics.state_raw_bytes.inc(raw_bytes({**state.weights, **{f"control/{n}": a for n, a in state.control.items()},
                                                        **_prototypes(state)}))
            for old_round, old_chunks in self.retained.published(family, state.round, state.digest, len(pieces)):
                for topic in self.topics.global_state_topics(family, old_round, old_chunks):
                    if topic not in in_use:
                        self.publish(topic, b"", "global_state", retain=True)
        record = self.retained.unsaved()
        if record is not None:  # after the clearing above: a crash before it still finds them recorded
            self.actions.add(Save(RETAINED, record))
        return sent

    def task(self, announcement: TaskAnnouncement) -> None:
        """The run's card, retained: what a late agent reads first."""
        self.publish(self.topics.task, self.sealed(encode_message(announcement)), "task", retain=True)

    def notice(self, notice: Notice) -> None:
        """Not retained: a refusal is news for an agent online now; a later one earns a new notice."""
        self.publish(self.topics.notices(notice.agent_id), self.sealed(encode_message(notice)), "notice", retain=False)

    def status(self, status: CoordinatorStatus) -> None:
        self.publish(self.topics.coordinator_status, self.sealed(encode_message(status)), "coordinator_status",
                     retain=True)


def _prototypes(state: FamilyState) -> dict[str, np.ndarray]:
    return {} if state.prototypes is None or state.prototype_counts is None else {
        "prototypes": state.prototypes, "counts": state.prototype_counts}
