"""Everything the coordinator receives is decoded here: topic, size limits, signature, chunks, compression.

``Intake.receive`` turns a raw message into a value: a decoded status or update for admission to
decide on, a refusal (the message could not be read or trusted), or nothing yet (more chunks to
come). It keeps only the reassembler's partial transfers; it never touches run state.

``Intake.open`` is the costly part of receiving an update (its signature's hash, decoding and
validation, its delta's norm), on any thread: the service runs it on a small pool, ahead of the
loop (app/openers.py), and hands the result to ``receive`` with ``hand``. It reads no run state
and no reassembler: chunks are only decoded there and reassembled on the loop, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.admission.decisions import Reject
from coordinator.admission.partials import PartialIn
from coordinator.admission.unpacking import StateArrays, unpack_update, update_raw_bytes
from coordinator.aggregation.running_mean import with_norm
from coordinator.reasons import RejectReason
from coordinator.telemetry.metrics import CoordinatorMetrics
from coordinator.telemetry.rejects import RejectLog
from protocol.compression import CompressionSpec
from protocol.errors import ProtocolError
from protocol.limits import DecodeLimits
from protocol.messages import AgentStatus, Chunk, Signed, Update
from protocol.partials import PartialAggregate
from protocol.security.trust import Received, Trust, accept, decode_trusted
from protocol.site_rosters import MAX_ROSTER_STATUSES, MAX_SITE_AGENTS, SiteRoster
from protocol.topics import ParsedTopic, Topics
from protocol.transport.chunking import Reassembler, verify_chunk
from protocol.wire import decode_message

log = logging.getLogger(__name__)

STATUS_MIN_CLASSES = 1024
"""Label counts a status may carry even when the run's task has fewer classes: an agent of another task
must still be heard (and counted as ``task_mismatch``), not dropped as too large."""


def status_limits(num_classes: int) -> DecodeLimits:
    """A status holds one array, the agent's label counts (8 bytes per class)."""
    n = max(STATUS_MIN_CLASSES, num_classes)
    return DecodeLimits(max_payload_bytes=64 * 1024 + 8 * n, max_array_elements=n, max_total_elements=n,
                        max_container_len=256)


@dataclass(frozen=True)
class StatusIn:
    agent_id: str
    """From the topic."""
    status: AgentStatus
    signer: str | None
    """The enrolled agent whose key signed it; None when enrollment is open."""


def roster_limits(num_classes: int) -> DecodeLimits:
    """A roster: up to ``MAX_ROSTER_STATUSES`` statuses (each with its label counts) and ``MAX_SITE_AGENTS`` ids."""
    per_status = status_limits(num_classes)
    return DecodeLimits(max_payload_bytes=4 * 1024 * 1024 + MAX_ROSTER_STATUSES * per_status.max_payload_bytes // 16,
                        max_array_elements=per_status.max_array_elements,
                        max_total_elements=MAX_ROSTER_STATUSES * per_status.max_array_elements,
                        max_container_len=MAX_SITE_AGENTS)


@dataclass(frozen=True)
class RosterIn:
    """A site aggregator's roster, signed by the key enrolled for the site its topic names."""

    roster: SiteRoster
    size: int
    """Bytes on the wire."""


@dataclass(frozen=True)
class StatusCleared:
    agent_id: str


@dataclass(frozen=True)
class UpdateIn:
    topic: ParsedTopic
    update: Update
    """Decompressed: plain arrays in the family's layout."""
    size: int
    """Bytes on the wire (all chunks)."""


@dataclass(frozen=True)
class Refused:
    kind: str
    """agent_status | update | unknown"""
    sender: str
    reject: Reject


Inbound = StatusIn | StatusCleared | UpdateIn | PartialIn | RosterIn | Refused


@dataclass(frozen=True)
class Opened:
    """An update message opened by ``Intake.open``: what ``receive`` would have made of ``payload`` first."""

    payload: bytes
    """The message it was opened from (``receive`` uses it for this message only)."""
    message: Received[Update] | Chunk | None
    """The verified, decoded update (its delta carrying its norm), or a chunk to reassemble; None: ``error``."""
    error: ProtocolError | None = None


class Intake:
    def __init__(self, topics: Topics, metrics: CoordinatorMetrics, trust: Trust, compression: CompressionSpec,
                 max_update_bytes: int, num_classes: int, rejects: RejectLog) -> None:
        self.topics = topics
        self.metrics = metrics
        self.trust = trust
        """Enrollment required: only what an enrolled agent signed gets past decoding."""
        self.compression = compression
        self.rejects = rejects
        self.update_limits = DecodeLimits(max_payload_bytes=max_update_bytes)
        self.status_limits = status_limits(num_classes)
        self.roster_limits = roster_limits(num_classes)
        self.reassembler = Reassembler(max_bytes=4 * max_update_bytes, max_bytes_per_source=max_update_bytes)
        self._handed: Opened | None = None

    def open(self, payload: bytes, topic: str) -> Opened:
        """Verify, decode and validate an update message (one whole, or a chunk: signed by the topic's agent for
        that topic), and take its delta's norm. Safe on any thread: it reads only the trusted keys, and the metrics
        it counts are thread-safe."""
        try:
            message = decode_message(payload, (Update, Signed, Chunk), self.update_limits)
            if isinstance(message, Chunk):
                verify_chunk(message, topic, self.trust, self.topics.parse(topic).agent_id)
                return Opened(payload, message)
            received = accept(message, len(payload), Update, self.update_limits, self.trust)
        except ProtocolError as exc:
            return Opened(payload, None, exc)
        update = received.message
        normed = {name: with_norm(arrays) for name, arrays, packed in (
            ("delta", update.delta, update.packed_delta), ("control_delta", update.control_delta,
                                                           update.packed_control_delta))
            if arrays and not packed}  # once, here on a worker: a packed one's is taken once unpacked
        if normed:
            update = update.model_copy(update=normed)
            received = Received(update, received.size, received.signer)
        return Opened(payload, received)

    def hand(self, opened: Opened) -> None:
        """The next ``receive`` of ``opened.payload`` starts from ``opened`` instead of decoding it again."""
        self._handed = opened

    def receive(self, topic: str, payload: bytes, states: Mapping[str, StateArrays], oldest_round: int = 0
                ) -> Inbound | None:
        """``states``: each family's current global state, which compressed deltas unpack against; ``oldest_round``:
        chunks of an update for an older round are refused before they are held (``late``)."""
        opened, self._handed = self._handed, None
        if opened is not None and opened.payload is not payload:
            opened = None
        try:
            parsed = self.topics.parse(topic)
        except ProtocolError as exc:
            return Refused("unknown", topic.split("/")[-1], Reject(exc.reason, exc.detail))
        self.metrics.bytes_received.labels(parsed.kind).inc(len(payload))
        self.metrics.messages_received.labels(parsed.kind).inc()
        assert parsed.agent_id is not None
        if parsed.kind == "agent_status":
            return self._status(parsed.agent_id, payload)
        if parsed.kind == "update":
            return self._update(parsed, payload, states, opened or self.open(payload, topic), oldest_round)
        if parsed.kind == "partial":
            return self._partial(parsed, payload)
        if parsed.kind == "site_roster":
            return self._roster(parsed.agent_id, payload)
        return None

    def _roster(self, site_id: str, payload: bytes) -> Inbound:
        try:
            received = decode_trusted(payload, SiteRoster, self.roster_limits, self.trust)
        except ProtocolError as exc:
            return Refused("site_roster", site_id, Reject(exc.reason, exc.detail))
        roster = received.message
        if roster.site_id != site_id or (received.signer is not None and received.signer != site_id):
            return Refused("site_roster", site_id, Reject(
                RejectReason.SIGNER_MISMATCH, f"roster of {roster.site_id} on {site_id}'s topic, signed by "
                                              f"{received.signer or 'nobody'}"))
        return RosterIn(roster, received.size)

    def _partial(self, parsed: ParsedTopic, payload: bytes) -> Inbound:
        """A site aggregator's partial aggregate: signed by the key enrolled for the site its topic names."""
        assert parsed.agent_id is not None
        try:
            received = decode_trusted(payload, PartialAggregate, self.update_limits, self.trust)
        except ProtocolError as exc:
            return Refused("partial", parsed.agent_id, Reject(exc.reason, exc.detail))
        if received.signer is not None and received.signer != received.message.site_id:
            return Refused("partial", parsed.agent_id, Reject(
                RejectReason.SIGNER_MISMATCH, f"partial of {received.message.site_id} signed by {received.signer}'s key"))
        return PartialIn(parsed, received.message, received.size)

    def _status(self, agent_id: str, payload: bytes) -> Inbound:
        if not payload:  # a cleared retained status: the agent was removed
            return StatusCleared(agent_id)
        try:
            received = decode_trusted(payload, AgentStatus, self.status_limits, self.trust)
        except ProtocolError as exc:
            return Refused("agent_status", agent_id, Reject(exc.reason, exc.detail))
        return StatusIn(agent_id, received.message, received.signer)

    def _update(self, parsed: ParsedTopic, payload: bytes, states: Mapping[str, StateArrays],
                opened: Opened, oldest_round: int = 0) -> Inbound | None:
        assert parsed.agent_id is not None
        try:
            if opened.error is not None:
                raise opened.error
            received = opened.message
            if isinstance(received, Chunk):
                # A signed chunk proves its sender and topic, not that it is new: an agent's old transfers, replayed
                # on their own rounds' topics, would take its two transfer slots from the one it sends now.
                if parsed.round is not None and parsed.round < oldest_round:
                    return Refused("update", parsed.agent_id, Reject(
                        RejectReason.LATE, f"a chunk of round {parsed.round}, older than round {oldest_round}"))
                whole = self.reassembler.add(parsed.agent_id, received, parsed.round or 0)
                if whole is None:  # more chunks to come
                    return None
                received = decode_trusted(whole, Update, self.update_limits, self.trust)  # on the loop: the rare case
            assert received is not None
            message = received.message
            if received.signer is not None and received.signer != message.agent_id:
                return Refused("update", parsed.agent_id, Reject(
                    RejectReason.SIGNER_MISMATCH, f"update of {message.agent_id} signed by {received.signer}'s key"))
            update = unpack_update(message, self.compression, states)
        except ProtocolError as exc:
            return Refused("update", parsed.agent_id, Reject(exc.reason, exc.detail))
        if isinstance(update, Reject):
            return Refused("update", parsed.agent_id, update)
        self.metrics.update_wire_bytes.inc(received.size)
        self.metrics.update_raw_bytes.inc(update_raw_bytes(update))
        if self.compression.kind != "none" and message.delta and not message.packed_delta:
            self._uncompressed(message)
        return UpdateIn(parsed, update, received.size)

    def _uncompressed(self, update: Update) -> None:
        """A plain delta in a compressed run: allowed (the round loses nothing), counted, and logged
        once per agent with the reason the agent gave (an older agent gives none)."""
        self.metrics.updates_uncompressed.labels("declined" if update.compression_declined else "unexplained").inc()
        if self.rejects.first(update.agent_id, "uncompressed"):
            log.warning("%s sends its delta uncompressed although the run compresses with %s: %s", update.agent_id,
                        self.compression, update.compression_declined or "it gave no reason")
