"""What the network thread decides about a message before it is queued: whose it is, and whether it is queued.

The sender is the agent id the topic names (``fl/{federation}/agents/{id}/status``,
``fl/{federation}/updates/{id}/{round}``): the inbox queues per sender (app/inbox.py). With
enrollment required, a message on the topic of an agent that is not enrolled is dropped here, at
the cost of a dictionary lookup: nothing it carries could be accepted (only the key enrolled for
that agent may sign for it), and decoding it on the loop made honest agents wait (a flood of
57,000 such messages once made a round miss its quorum). A message on an enrolled agent's topic
goes on to the signature check, which refuses it if another key signed it. So does a cleared
status (an empty payload, nothing to decode): an operator decommissions an agent by clearing its
retained status, possibly once it left the enrollment file, and the engine then forgets it.

What is dropped here is counted as the intake and admission count what they refuse: received
(``fl_received_bytes_total``, ``fl_received_messages_total``, by kind), rejected
(``fl_messages_rejected_total{kind, reason}``, ``fl_updates_total{outcome="rejected"}`` for an
update), the first per sender and reason logged, for the first ``LOGGED_SENDERS`` senders only (a
flood names a new made-up agent in every message, and a log line costs the network thread three
times what the drop costs: past them drops are only counted). An unenrolled sender's message is
``unknown_signer`` (signed or not: no key is trusted for that agent), one over its sender's
queue bound ``sender_backlog``, a topic that does not parse ``bad_topic``. Differences: a
chunked update is counted per chunk, not once per update; and the round's own count of rejected
updates (the rounds log) does not include these, since run state belongs to the loop.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from coordinator.app.inbox import Bound
from coordinator.fleet.enrollment import RELOAD_EVERY_S, Enrollment, EnrollmentError, read_enrollment
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.errors import ProtocolError, Reason
from protocol.topics import ParsedTopic, Topics
from protocol.transport.chunking import CHUNK_OVERHEAD_BYTES

log = logging.getLogger(__name__)
rejects_log = logging.getLogger("coordinator.rejects")

LOGGED_SENDERS = 100
"""(sender, reason) pairs whose first drop here is logged; later ones are only counted."""
SENDER_BACKLOG = "sender_backlog"
"""Reject reason: the sender already has as much queued as it may (``sender_bounds``)."""
LANES = ("agent_status", "update", "partial", "site_roster", "secagg")
CLEARED_BY_STRANGERS = "\x00cleared"
"""The one sender all cleared statuses of ids not enrolled queue under (anyone may clear a retained status, and a
made-up id per message would otherwise get a bound of its own each time)."""

STATUS_BACKLOG = 32
"""Statuses one sender may have queued: an agent sends one per heartbeat (15 s by default) and one per change
of state, so an honest agent has this many queued only when the loop is minutes behind."""
UPDATE_BACKLOG = 4
"""Whole updates (every chunk of each) one sender may have queued: it sends one per round it trains in."""
SMALLEST_CHUNK_BYTES = 4096
"""The least ``max_message_bytes`` an agent may chunk with: the most chunks an update can come in."""


PARTIAL_BACKLOG = 2 * 64
"""Partials one site may have queued: one per family (at most 64) a round, two rounds' worth."""
ROSTER_BACKLOG = 8
"""Rosters one site may have queued: it sends one every ``roster_interval_s`` and one per change."""
SECAGG_BACKLOG = 8
"""Stage messages one agent may have queued: four stages a round, two rounds' worth."""


def sender_bounds(max_update_bytes: int, max_status_bytes: int, max_roster_bytes: int = 64 << 20) -> dict[str, Bound]:
    """Per lane, what one sender may have queued: honest senders stay far below, a flood on one topic is cut off."""
    chunks = math.ceil(max_update_bytes / (SMALLEST_CHUNK_BYTES - CHUNK_OVERHEAD_BYTES))
    update_bytes = max_update_bytes + chunks * CHUNK_OVERHEAD_BYTES
    return {
        "agent_status": Bound(STATUS_BACKLOG, STATUS_BACKLOG * max_status_bytes),
        "update": Bound(UPDATE_BACKLOG * chunks, UPDATE_BACKLOG * update_bytes),
        # A partial carries float64 sums of the delta (and SCAFFOLD's control delta): up to 4x an update's bytes.
        "partial": Bound(PARTIAL_BACKLOG, 2 * 4 * update_bytes),
        "site_roster": Bound(ROSTER_BACKLOG, ROSTER_BACKLOG * max_roster_bytes),
        "secagg": Bound(SECAGG_BACKLOG, SECAGG_BACKLOG * update_bytes),
    }


class EnrolledIds:
    """Whether an agent id is enrolled, asked on the network thread.

    First the engine's ``Enrollment.get``: a dictionary read, safe from any thread (the engine's
    thread replaces the dictionary when it reloads the file, never changes it in place). On a
    miss, the ids in the file as this object last read it: it checks the file at most once a
    second (on a miss only) and reads it again when it changed, so that an agent enrolled while
    the coordinator runs is let through before the engine's thread has re-read the file (which it
    does when that agent's key first signs something). The engine's ``Enrollment`` is never
    reloaded from this thread.
    """

    def __init__(self, enrollment: Enrollment, clock: Callable[[], float] = time.monotonic) -> None:
        self.enrollment = enrollment
        self.clock = clock
        self._ids: frozenset[str] = frozenset()
        self._stamp: tuple[int, int] | None = None
        self._checked = -math.inf

    def __contains__(self, agent_id: str) -> bool:
        if self.enrollment.get(agent_id) is not None or agent_id in self._ids:
            return True
        now = self.clock()
        if now - self._checked < RELOAD_EVERY_S:
            return False
        self._checked = now
        self._reread()
        return agent_id in self._ids

    def _reread(self) -> None:
        path = self.enrollment.path
        try:
            stat = path.stat()
        except FileNotFoundError:
            self._stamp, self._ids = None, frozenset()
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            ids = frozenset(read_enrollment(path))
        except EnrollmentError as exc:  # the engine logs it as an error when it reads the file
            log.debug("enrollment file unreadable, kept the ids as they were: %s", exc)
            return
        self._stamp, self._ids = stamp, ids


class SenderGate:
    """Used by the network thread only (it keeps its own record of what it logged: the engine's reject log
    belongs to the loop)."""

    def __init__(self, topics: Topics, metrics: CoordinatorMetrics, enrollment: Enrollment | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topics = topics
        self.metrics = metrics
        self.enrolled = None if enrollment is None else EnrolledIds(enrollment, clock)
        """None: enrollment is open, every sender is queued."""
        self._logged: set[tuple[str, str]] = set()
        for kind in LANES:  # present from the start, so increase() sees the first one
            metrics.rejected.labels(kind, SENDER_BACKLOG)

    def admit(self, topic: str, payload: bytes) -> ParsedTopic | None:
        """The parsed topic of a message to queue (its ``agent_id`` the sender, its ``kind`` the lane);
        None: dropped here, and counted."""
        try:
            parsed = self.topics.parse(topic)
        except ProtocolError as exc:
            self._reject("unknown", exc.reason.value, topic.split("/")[-1], exc.detail)
            return None
        agent_id = parsed.agent_id
        cleared = parsed.kind == "agent_status" and not payload
        if self.enrolled is not None and agent_id is not None and not cleared and agent_id not in self.enrolled:
            self.drop(parsed, payload, Reason.UNKNOWN_SIGNER.value, f"no key is enrolled for agent {agent_id}")
            return None
        return parsed

    def sender_of(self, parsed: ParsedTopic, payload: bytes) -> str:
        """Whom the inbox bounds ``parsed`` under: its agent id, or one shared sender for statuses that ids not
        enrolled clear."""
        agent_id = parsed.agent_id or ""
        if parsed.kind == "agent_status" and not payload and self.enrolled is not None and agent_id not in self.enrolled:
            return CLEARED_BY_STRANGERS
        return agent_id

    def over_bound(self, parsed: ParsedTopic, payload: bytes, bound: Bound | None) -> None:
        """The inbox refused it: its sender has as much queued as it may."""
        limit = "" if bound is None else f" ({bound.messages} messages or {bound.bytes} bytes)"
        self.drop(parsed, payload, SENDER_BACKLOG, f"it has as much queued as one sender may{limit}")

    def drop(self, parsed: ParsedTopic, payload: bytes, reason: str, detail: str) -> None:
        self.metrics.bytes_received.labels(parsed.kind).inc(len(payload))
        self.metrics.messages_received.labels(parsed.kind).inc()
        if parsed.kind == "update":
            self.metrics.updates.labels("rejected").inc()
        self._reject(parsed.kind, reason, parsed.agent_id or "", detail)

    def _reject(self, kind: str, reason: str, sender: str, detail: str) -> None:
        self.metrics.rejected.labels(kind, reason).inc()
        if len(self._logged) >= LOGGED_SENDERS or (sender, reason) in self._logged:
            return
        self._logged.add((sender, reason))
        rejects_log.warning("dropped %s from %s before queueing: %s: %s (further ones for this reason are only "
                            "counted)", kind, sender, reason, detail)
        if len(self._logged) == LOGGED_SENDERS:
            rejects_log.warning("logged the first drop of %d senders before queueing; further senders' drops are "
                                "only counted (fl_messages_rejected_total)", LOGGED_SENDERS)
