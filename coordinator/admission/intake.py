"""Everything the coordinator receives passes here: decoded, validated, counted, or dropped.

A message that fails any check is dropped and counted by reason; the first drop for each
(sender, reason) is logged, later ones only counted, so a broken device cannot flood the log.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from coordinator.admission.unpacking import unpack_update, update_raw_bytes
from coordinator.fleet.agents import RegistryFull
from coordinator.policies import AdmissionView, Defer
from coordinator.reasons import RejectedUpdate, RejectReason
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.compression import CompressionSpec
from protocol.errors import ProtocolError
from protocol.limits import DecodeLimits
from protocol.messages import AgentStatus, Update
from protocol.security.trust import OPEN, Trust, decode_trusted
from protocol.topics import ParsedTopic
from protocol.transport.chunking import Reassembler, receive

if TYPE_CHECKING:
    from coordinator.round.engine import RoundEngine

log = logging.getLogger(__name__)

_MAX_LOGGED = 10_000

STATUS_MIN_CLASSES = 1024
"""Label counts a status may carry even when the run's task has fewer classes: an agent of another task
must still be heard (and counted as ``task_mismatch``), not dropped as too large."""


def status_limits(num_classes: int) -> DecodeLimits:
    """A status holds one array, the agent's label counts (8 bytes per class)."""
    n = max(STATUS_MIN_CLASSES, num_classes)
    return DecodeLimits(max_payload_bytes=64 * 1024 + 8 * n, max_array_elements=n, max_total_elements=n,
                        max_container_len=256)


class InboundFilter:
    def __init__(self, engine: RoundEngine, metrics: CoordinatorMetrics) -> None:
        self.engine = engine
        self.metrics = metrics
        self.update_limits = DecodeLimits(max_payload_bytes=engine.settings.max_update_bytes)
        self.status_limits = status_limits(engine.task.card.num_classes)
        self.compression = CompressionSpec.parse(engine.settings.compression)
        self.reassembler = Reassembler(max_bytes=4 * engine.settings.max_update_bytes,
                                       max_bytes_per_source=engine.settings.max_update_bytes)
        self.trust = OPEN if engine.enrollment is None else Trust(engine.enrollment.lookup, required=True)
        """Enrollment required: only what an enrolled agent signed gets past decoding."""
        self._logged: set[tuple[str, str]] = set()
        self.deferred: list[tuple[ParsedTopic, Update, int]] = []
        """Asynchronous rounds: updates to offer the next buffer (bounded, see ``defer``)."""

    def handle(self, topic: str, payload: bytes) -> None:
        try:
            parsed = self.engine.topics.parse(topic)
        except ProtocolError as exc:
            self.reject("unknown", exc.reason.value, topic.split("/")[-1], exc.detail)
            return
        self.metrics.bytes_received.labels(parsed.kind).inc(len(payload))
        self.metrics.messages_received.labels(parsed.kind).inc()
        if parsed.kind == "agent_status":
            self._agent_status(parsed, payload)
        elif parsed.kind == "update":
            self._update(parsed, payload)

    # -- agent status --------------------------------------------------------------------
    def _agent_status(self, parsed: ParsedTopic, payload: bytes) -> None:
        assert parsed.agent_id is not None
        if not payload:  # a cleared retained status: the agent was removed
            self.engine.forget_agent(parsed.agent_id)
            return
        try:
            received = decode_trusted(payload, AgentStatus, self.status_limits, self.trust)
        except ProtocolError as exc:
            self.reject("agent_status", exc.reason.value, parsed.agent_id, exc.detail)
            return
        status = received.message
        if received.signer is not None and received.signer != status.agent_id:
            self.reject("agent_status", RejectReason.SIGNER_MISMATCH.value, parsed.agent_id,
                        f"status of {status.agent_id} signed by {received.signer}'s key")
            return
        if status.agent_id != parsed.agent_id:
            self.reject("agent_status", RejectReason.TOPIC_MISMATCH.value, parsed.agent_id,
                         f"status names {status.agent_id}")
            return
        problem = self.engine.task.status_problem(status)
        if problem is not None:  # kept (the operator sees it) but never selected; counted at every status
            self.reject("agent_status", RejectReason.TASK_MISMATCH.value, parsed.agent_id, problem,
                        action="cannot select")
        try:
            status = self.engine.observe_labels(status)
        except ValueError as exc:  # another label space than the run's task
            self.reject("agent_status", RejectReason.TASK_MISMATCH.value, parsed.agent_id, str(exc),
                        action="ignored the label counts of")
            status = status.model_copy(update={"label_counts": None})
        previous = self.engine.registry.get(status.agent_id)
        try:
            self.engine.observe_agent(status)
        except RegistryFull as exc:
            self.reject("agent_status", RejectReason.REGISTRY_FULL.value, parsed.agent_id, str(exc))
            return
        self.engine.privacy.observe(status.agent_id, status.device, status.privacy)
        if previous is None or previous.status.state != status.state:
            spent = f", epsilon {status.privacy.epsilon:.4g}" if status.privacy is not None else ""
            log.info("agent %s (%s, %s, %d samples) is %s%s", status.agent_id, status.device, status.family,
                     status.num_samples, status.state, spent)

    # -- updates -------------------------------------------------------------------------
    def _update(self, parsed: ParsedTopic, payload: bytes) -> None:
        assert parsed.agent_id is not None and parsed.round is not None
        try:
            received = receive(payload, parsed.agent_id, Update, self.reassembler, self.update_limits, self.trust)
            if received is None:  # more chunks to come
                return
            if received.signer is not None and received.signer != received.message.agent_id:
                raise RejectedUpdate(RejectReason.SIGNER_MISMATCH,
                                     f"update of {received.message.agent_id} signed by {received.signer}'s key")
            update = unpack_update(received.message, self.compression, self.engine.strategy.states)
        except (ProtocolError, RejectedUpdate) as exc:
            self._rejected_update(parsed, exc)
            return
        self.metrics.update_wire_bytes.inc(received.size)
        self.metrics.update_raw_bytes.inc(update_raw_bytes(update))
        if self.compression.kind != "none" and received.message.delta and not received.message.packed_delta:
            self._uncompressed(received.message)
        self.admit(parsed, update, received.size)

    def _uncompressed(self, update: Update) -> None:
        """A plain delta in a compressed run: allowed (the round loses nothing), counted, and logged
        once per agent with the reason the agent gave (an older agent gives none)."""
        self.metrics.updates_uncompressed.labels("declined" if update.compression_declined else "unexplained").inc()
        if (update.agent_id, "uncompressed") not in self._logged and len(self._logged) < _MAX_LOGGED:
            self._logged.add((update.agent_id, "uncompressed"))
            log.warning("%s sends its delta uncompressed although the run compresses with %s: %s", update.agent_id,
                        self.compression, update.compression_declined or "it gave no reason")

    def admit(self, parsed: ParsedTopic, update: Update, size: int) -> None:
        """The round policy's verdict on a decoded, signature-checked update (also for one it deferred)."""
        engine = self.engine
        try:
            admission = engine.policy.admit(parsed, update, self.admission_view())
            if engine.settings.weighting == "kl" and update.task == "train":
                factor = engine.labels.weight_factor(update.agent_id, engine.settings.kl_temperature)
                admission = replace(admission, weight=admission.weight * factor)
            norm = engine.norms.check(update.family, update.delta) if update.delta else None
        except Defer:
            if not self.defer(parsed, update, size):
                self._rejected_update(parsed, RejectedUpdate(RejectReason.DEFERRED_OVERFLOW,
                                                             f"{len(self.deferred)} updates already wait"))
            return
        except (ProtocolError, RejectedUpdate) as exc:
            self._rejected_update(parsed, exc)
            return
        engine.accept_update(update, size, norm, admission)

    def _rejected_update(self, parsed: ParsedTopic, exc: ProtocolError | RejectedUpdate) -> None:
        assert parsed.agent_id is not None
        if self.engine.open is not None:
            self.engine.open.rejected += 1
        self.metrics.updates.labels("rejected").inc()
        self.reject("update", exc.reason.value, parsed.agent_id, exc.detail)

    def admission_view(self) -> AdmissionView:
        """What the policy may read to admit an update."""
        engine = self.engine
        open_round = engine.open
        strategy = engine.strategy

        def family_of(agent_id: str) -> str | None:
            record = engine.registry.get(agent_id)
            return None if record is None else record.status.family

        def sample_cap(agent_id: str) -> int:
            enrolled = engine.enrollment.get(agent_id) if engine.enrollment is not None else None
            return min(engine.settings.max_samples_per_update, (enrolled.max_samples if enrolled else None) or 2**62)

        def check_task(update: Update) -> None:
            assert open_round is not None
            engine.task.check_update(update, open_round.announcement)

        def check_payload(update: Update, against_current: bool) -> None:
            (strategy.check_update if against_current else strategy.check_delta)(update)

        return AdmissionView(
            run_id=engine.run_id, next_round=engine.next_round, open_round=open_round, closing=engine.closing is not None,
            family_of=family_of, sample_cap=sample_cap, check_task=check_task, check_payload=check_payload,
            version_digest=engine.versions.digest)

    def defer(self, topic: ParsedTopic, update: Update, size: int) -> bool:
        """Hold an admissible-later update for the next buffer; False when too many already wait."""
        if len(self.deferred) >= max(64, 2 * self.engine.settings.buffer_size):
            return False
        self.deferred.append((topic, update, size))
        self.metrics.deferred.inc()
        return True

    def replay_deferred(self) -> None:
        """Offer the updates held back while the last buffer closed to the one just opened."""
        waiting, self.deferred = self.deferred, []
        for topic, update, size in waiting:
            self.admit(topic, update, size)

    def reject(self, kind: str, reason: str, sender: str, detail: str, action: str = "dropped") -> None:
        self.metrics.rejected.labels(kind, reason).inc()
        if (sender, reason) not in self._logged and len(self._logged) < _MAX_LOGGED:
            self._logged.add((sender, reason))
            log.warning("%s %s from %s: %s: %s (further ones for this reason are only counted)",
                        action, kind, sender, reason, detail)
