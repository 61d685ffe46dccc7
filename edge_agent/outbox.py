"""How an agent's plain updates leave: signed, split into signed chunks when large, published at QoS 1, and
kept to send again to a coordinator session that may have lost them.

Called from the agent's loop only (one writer per socket); a secure round's updates leave masked, through
``edge_agent.secure``, not here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edge_agent.pending import SentUpdate
from protocol.messages import CoordinatorStatus, RoundAnnouncement, Update
from protocol.security.signing import SigningKey
from protocol.topics import Topics
from protocol.transport.chunking import split_payload
from protocol.wire import encode_message

log = logging.getLogger(__name__)


class UpdateOutbox:
    def __init__(self, agent_id: str, topics: Topics, publish: Callable[[str, bytes], object],
                 seal: Callable[[bytes], bytes], signing_key: SigningKey | None, max_message_bytes: int) -> None:
        self.agent_id = agent_id
        self.topics = topics
        self._publish = publish
        """Publishes one message at QoS 1 (queued by paho while disconnected, sent again after a reconnect)."""
        self._seal = seal
        self._signing_key = signing_key
        self._max_message_bytes = max_message_bytes
        self.sent: SentUpdate | None = None
        """The last update published, as its pieces."""

    def send(self, update: Update, coordinator: CoordinatorStatus | None) -> None:
        topic = self.topics.update(self.agent_id, update.round)
        pieces = split_payload(self._seal(encode_message(update)), self._max_message_bytes, self._signing_key, topic)
        self._publish_pieces(topic, pieces)
        sessions = {coordinator.session} if coordinator is not None else set()
        self.sent = SentUpdate(update.run_id, update.round, pieces, sessions)
        privacy = f", epsilon {update.privacy.epsilon:.4g}" if update.privacy is not None else ""
        log.info("round %d (%s): sent %s, held-out accuracy of the model the round started from %.3f%s", update.round,
                 update.task, "weights" if update.weights else "delta" if update.delta
                 else "prototypes" if update.prototypes is not None else "metrics",
                 update.metrics.eval_accuracy or 0.0, privacy)

    def resend_if_new_session(self, ann: RoundAnnouncement, coordinator: CoordinatorStatus | None) -> None:
        """Send the update for ``ann`` again if a coordinator session it was not sent to announced it; each session
        gets it once (a replayed older status, signed, verifies: it must not make the agent upload again and again)."""
        sent = self.sent
        if sent is None or (sent.run_id, sent.round) != (ann.run_id, ann.round):
            return
        if coordinator is None or coordinator.run_id != ann.run_id or coordinator.session in sent.sessions:
            return
        log.info("coordinator session %s re-announced round %d: sending the update again", coordinator.session,
                 ann.round)
        self._publish_pieces(self.topics.update(self.agent_id, ann.round), sent.pieces)
        sent.sessions.add(coordinator.session)

    def _publish_pieces(self, topic: str, pieces: list[bytes]) -> None:
        for piece in pieces:
            self._publish(topic, piece)
