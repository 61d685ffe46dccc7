"""Why the coordinator dropped an update that decoded fine, as a bounded set of reasons."""

from __future__ import annotations

from enum import Enum


class RejectReason(str, Enum):
    WRONG_ROUND = "wrong_round"
    LATE = "late"
    NO_OPEN_ROUND = "no_open_round"
    UNKNOWN_AGENT = "unknown_agent"
    UNSELECTED = "unselected"
    DUPLICATE = "duplicate"
    WRONG_RUN = "wrong_run"
    TOPIC_MISMATCH = "topic_mismatch"
    WRONG_TASK = "wrong_task"
    WRONG_FAMILY = "wrong_family"
    STALE_BASE = "stale_base"
    MISSING_PAYLOAD = "missing_payload"
    REGISTRY_FULL = "registry_full"
    """A status from a new agent while the registry holds its maximum of live agents."""
    SIGNER_MISMATCH = "signer_mismatch"
    """Signed by an enrolled key, but another agent's than the one the message names."""
    TOO_STALE = "too_stale"
    """Asynchronous rounds: trained from a global version more than max_staleness versions old."""
    DEFERRED_OVERFLOW = "deferred_overflow"
    """Asynchronous rounds: more updates waiting for the next buffer than it may hold."""
    COMPRESSION_MISMATCH = "compression_mismatch"
    """A delta packed otherwise than the run's compression says."""
    STALE_STATUS = "stale_status"
    """An agent status older (its process epoch and sequence number) than one heard from that agent before: a replay."""
    TASK_MISMATCH = "task_mismatch"
    """Another task or version than the run's, or a model layout other than the one announced for its family."""
    BOOTSTRAP_DISAGREES = "bootstrap_disagrees"
    """A bootstrap round's proposal of a family's first state that a strict majority of its agents did not
    send byte for byte (or, without any strict majority, every proposal: the family bootstraps again)."""
    DUPLICATE_AGENT_ID = "duplicate_agent_id"
    """Two live processes send statuses under one agent id (``coordinator.fleet.notices.DuplicateWatch``)."""
    BAD_PARTIAL = "bad_partial"
    """A site's partial aggregate the root cannot use: an agent counted over its hard cap, sums that do not
    match the family's layout, or a round that does not fold a mean (a robust rule)."""
    SITE_TOO_FEW = "site_too_few"
    """A site's robust rule had fewer updates of a family than it needs to tolerate ``byzantine_f``: the site counts
    none of them (it does not average a possible attacker in). Also the root's own FedProto agents beside sites'
    sums, when too few of them hold a class for the rule: the sites' sums still count."""
    STALE_ROSTER = "stale_roster"
    """A site's roster no newer than one the root took from it (a replay, or a site clock set back)."""
    BAD_COUNTS = "bad_counts"
    """FedProto: per-class prototype counts summing to more than the update's claimed samples."""
    HELD_ELSEWHERE = "held_elsewhere"
    """A site's roster claims an agent that is live behind another site, or that speaks to the root itself:
    the claim is ignored (a site could otherwise pull another's agents into its own secure sessions)."""
    SECURE_ONLY = "secure_only"
    """A plain training update in a securely aggregated round: only masked inputs count there."""
    SECAGG_REFUSED = "secagg_refused"
    """A secure-aggregation stage message out of turn (late, early, repeated, malformed; ``SecAggRefused``)."""
    SITE_UNSUPPORTED = "site_unsupported"
    """A plain update of an algorithm a site aggregator does not fold (FedProto's prototypes): refused at the site,
    so the root reads why in the site's partial."""
    BAD_SHAPE = "bad_shape"
    """Same label as the protocol's shape check: payload arrays whose layout the round cannot use
    (outvoted in a bootstrap round, prototypes or control variates of the wrong shape)."""


class RejectedUpdate(Exception):
    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
