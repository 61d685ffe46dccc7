"""Prometheus metrics of the coordinator, on an injectable registry.

Naming: one ``fl_`` prefix, base units, ``_total`` for counters. Labels are bounded: device
class, model family, message kind, outcome or reject reason, never an agent id. Device and
family values come from agents, so unknown ones fold into ``other`` past a small cap.

The registry also carries the client library's runtime collectors (``process_*``: memory, CPU,
file descriptors, start time, on Linux; ``python_*``: version and garbage collection), which a
custom registry does not get by default.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from coordinator.reasons import RejectReason
from coordinator.state.rounds import RoundSummary
from protocol.errors import Reason
from protocol.version import SOFTWARE_VERSION

KNOWN_DEVICES = ("jetson", "rpi", "phone", "cpu")
ROUND_OUTCOMES = ("completed", "quorum_missed", "failed", "interrupted")
ROUND_AGENT_STATES = ("selected", "answered", "straggling", "dropped", "surplus")
UPDATE_OUTCOMES = ("accepted", "rejected")
MAX_FAMILY_LABELS = 16

ROUND_PHASES = ("publish", "collect", "aggregate", "checkpoint")

# Every (kind, reason) the inbound filter can count, so the first drop of each shows in increase().
_REJECT_LABELS = {
    "update": sorted({r.value for r in Reason} | {r.value for r in RejectReason}),
    "agent_status": sorted({r.value for r in Reason} | {RejectReason.TOPIC_MISMATCH.value,
                                                      RejectReason.REGISTRY_FULL.value,
                                                      RejectReason.SIGNER_MISMATCH.value,
                                                      RejectReason.STALE_STATUS.value,
                                                      RejectReason.TASK_MISMATCH.value}),
    "unknown": [Reason.BAD_TOPIC.value],
}

_STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
_ROUND_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
_AGGREGATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


RUNTIME_PREFIXES = ("process_", "python_")


def register_runtime_collectors(registry: CollectorRegistry) -> None:
    """Process and Python metrics on ``registry``: each registry gets its own collectors (the
    global REGISTRY's are not reused), so a fresh registry per test or per service works."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


class CoordinatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        register_runtime_collectors(r)
        self.info = Info("fl_coordinator", "Coordinator build and configuration", registry=r)
        self.rounds = Counter("fl_rounds_total", "Rounds closed, by outcome", ["outcome"], registry=r)
        self.round_duration = Histogram("fl_round_duration_seconds", "Wall time from opening to the new state checkpointed (aggregation included)",
                                        buckets=_ROUND_BUCKETS, registry=r)
        self.current_round = Gauge("fl_round_current", "Number of the round in progress or last closed", registry=r)
        self.round_deadline = Gauge("fl_round_deadline_seconds", "Deadline of the current round", registry=r)
        self.round_learning_rate = Gauge("fl_round_learning_rate", "Local SGD learning rate the current round "
                                         "announced (learning_rate_decay lowers it each round)", registry=r)
        self.round_agents = Gauge("fl_round_agents", "Agents in the last closed round, by state",
                                  ["state"], registry=r)
        self.agents_selected = Counter("fl_agents_selected_total", "Agents selected, summed over rounds", registry=r)
        self.agents_answered = Counter("fl_agents_answered_total", "Selected agents whose update was accepted",
                                       registry=r)
        self.stragglers = Counter("fl_stragglers_total", "Selected agents online but not answering by the deadline",
                                  registry=r)
        self.dropouts = Counter("fl_dropouts_total", "Selected agents that went offline before answering", registry=r)
        self.updates = Counter("fl_updates_total", "Updates received, by outcome", ["outcome"], registry=r)
        self.updates_clipped = Counter(
            "fl_updates_clipped_total", "Accepted updates bounded by the coordinator: claim (counted for fewer "
            "samples than claimed) or norm (delta scaled to max_norm_ratio x the round's median)", ["what"], registry=r)
        for what in ("claim", "norm"):
            self.updates_clipped.labels(what)
        self.notices_sent = Counter("fl_notices_sent_total", "Refusal notices sent to agents (rate-limited per agent "
                                    "and reason), by reason", ["reason"], registry=r)
        self.duplicate_agent_ids = Counter(
            "fl_duplicate_agent_ids_total", "Statuses showing a second live process under an agent id already "
            "in use (two devices configured with one id)", registry=r)
        self.rejected = Counter("fl_messages_rejected_total", "Inbound messages dropped, by kind and reason",
                                ["kind", "reason"], registry=r)
        self.bytes_received = Counter("fl_received_bytes_total", "Payload bytes received, by message kind",
                                      ["kind"], registry=r)
        self.bytes_sent = Counter("fl_sent_bytes_total", "Payload bytes published, by message kind",
                                  ["kind"], registry=r)
        self.messages_received = Counter("fl_received_messages_total", "Messages received, by kind", ["kind"],
                                         registry=r)
        self.messages_sent = Counter("fl_sent_messages_total", "Messages published, by kind", ["kind"], registry=r)
        self.round_bytes = Gauge("fl_round_bytes", "Payload bytes of the last closed round, by direction",
                                 ["direction"], registry=r)
        self.aggregation_failures = Counter("fl_aggregation_failures_total",
                                            "Rounds whose updates could not be aggregated, by reason", ["reason"],
                                            registry=r)
        self.aggregation_duration = Histogram("fl_aggregation_duration_seconds", "Time to aggregate one round",
                                              buckets=_AGGREGATION_BUCKETS, registry=r)
        self.aggregation_spilled = Gauge("fl_aggregation_spilled_bytes",
                                         "Bytes of the last round's updates a robust rule kept in a memory-mapped file, "
                                         "past the aggregation memory budget", registry=r)
        self.round_phase = Histogram("fl_round_phase_seconds",
                                     "Time a round spent per phase: publish (its announcement and states), "
                                     "collect (until it closed), aggregate and checkpoint (off the message loop)",
                                     ["phase"], buckets=_ROUND_BUCKETS, registry=r)
        for phase in ROUND_PHASES:  # present from the start, so rate() sees the first round too
            self.round_phase.labels(phase)
        # Secure aggregation (coordinator/round/secure.py): per SecAgg+ stage.
        self.secagg_stage = Histogram("fl_secagg_stage_seconds", "Time each secure-aggregation stage stayed open",
                                      ["stage"], buckets=_ROUND_BUCKETS, registry=r)
        self.secagg_dropouts = Counter("fl_secagg_dropouts_total", "Agents that took part in the previous "
                                       "secure-aggregation stage but not in this one", ["stage"], registry=r)
        self.secagg_bytes = Counter("fl_secagg_bytes_total", "Payload bytes of secure-aggregation stage messages, "
                                    "by stage and direction", ["stage", "direction"], registry=r)
        self.secagg_dp_epsilon = Gauge("fl_secagg_dp_epsilon", "Distributed DP: epsilon spent by the noisy sums "
                                       "secure rounds released (at secagg_dp_delta)", registry=r)
        self.staleness = Histogram("fl_update_staleness_versions",
                                   "Global versions published between an accepted update's base and its arrival "
                                   "(asynchronous rounds; 0 in synchronous ones)", buckets=_STALENESS_BUCKETS,
                                   registry=r)
        self.deferred = Counter("fl_updates_deferred_total",
                                "Asynchronous rounds: updates held for the next buffer (their agent was in this "
                                "one, or a buffer was being aggregated)", registry=r)
        self.update_wire_bytes = Counter("fl_update_wire_bytes_total",
                                         "Bytes of updates as received (compressed or not)", registry=r)
        self.update_raw_bytes = Counter("fl_update_raw_bytes_total",
                                        "Bytes the same updates' arrays take uncompressed: over the wire bytes, the "
                                        "compression ratio", registry=r)
        self.state_raw_bytes = Counter("fl_global_state_raw_bytes_total",
                                       "Bytes the published global states' arrays take at the coordinator's "
                                       "precision: over fl_sent_bytes_total{kind=\"global_state\"}, their "
                                       "compression ratio (2 with --state-compression fp16)", registry=r)
        self.updates_uncompressed = Counter("fl_updates_uncompressed_total",
                                            "Training deltas sent uncompressed in a run that compresses, by why: "
                                            "declined (the agent said why) or unexplained", ["why"], registry=r)
        self.residual_norm = Gauge("fl_error_feedback_residual_norm",
                                   "L2 norm of the top-k error-feedback residual the last accepted update's agent "
                                   "keeps", registry=r)
        self.agents_online = Gauge("fl_agents_online", "Agents online and selectable, by device class",
                                   ["device"], registry=r)
        self.accuracy_spread = Gauge(
            "fl_federated_accuracy_spread_ratio", "Accuracy of the global model across the answering agents: their "
            "median, lowest and highest (one agent's claim moves the median by nothing)", ["statistic"], registry=r)
        self.accuracy = Gauge("fl_federated_accuracy_ratio",
                              "Sample-weighted accuracy of the global model on agents' held-out data",
                              ["family"], registry=r)
        self.loss = Gauge("fl_federated_loss", "Sample-weighted loss of the global model on agents' held-out data",
                          ["family"], registry=r)
        self.epsilon = Gauge("fl_privacy_epsilon", "Largest DP epsilon spent, by device class", ["device"],
                             registry=r)
        self.epsilon_max = Gauge("fl_privacy_epsilon_max", "Largest DP epsilon spent by any agent", registry=r)
        self.budget_exhausted = Gauge("fl_privacy_budget_exhausted_agents",
                                      "Agents whose DP budget is spent (they train no more), by device class",
                                      ["device"], registry=r)
        self.broker_connected = Gauge("fl_broker_connected", "1 while connected to the broker", registry=r)
        self.reconnects = Counter("fl_broker_reconnects_total", "Reconnections to the broker", registry=r)
        self.broker_denials = Counter("fl_broker_denials_total",
                                      "The coordinator's publishes and subscriptions the broker refused (MQTT 5 "
                                      "reason code >= 0x80, e.g. an ACL's not authorized), by action", ["action"],
                                      registry=r)
        self.agents_denied = Gauge("fl_agents_denied",
                                   "Agents heard from within agent_timeout_s whose publishes or subscriptions the "
                                   "broker refused (their status's denied count), by device class", ["device"],
                                   registry=r)
        self.agent_reconnects = Counter("fl_agent_reconnects_total",
                                        "Broker reconnections agents reported, by device class", ["device"],
                                        registry=r)
        self.agent_restarts = Counter("fl_agent_restarts_total",
                                      "Agents seen coming back as a new process, by device class", ["device"],
                                      registry=r)
        self.checkpoint_time = Gauge("fl_checkpoint_last_timestamp_seconds", "Unix time of the last checkpoint",
                                     registry=r)
        self.checkpoint_age = Gauge("fl_checkpoint_age_seconds", "Seconds since the last checkpoint", registry=r)
        self.checkpoint_bytes = Gauge("fl_checkpoint_bytes", "Size of the last checkpoint", registry=r)
        # For operators and alerts: how far the run is, and whether it is moving at all.
        self.run_finished = Gauge("fl_run_finished", "1 once the run has finished (training and evaluation)",
                                  registry=r)
        self.rounds_planned = Gauge("fl_rounds_planned", "Training rounds the run is configured for", registry=r)
        self.round_quorum = Gauge("fl_round_quorum", "Accepted updates needed to aggregate the round in progress",
                                  registry=r)
        self.last_progress = Gauge("fl_last_progress_timestamp_seconds",
                                   "Unix time the run last moved: coordinator start, a round opened or closed",
                                   registry=r)
        # Known label values start at 0, so rate() and increase() see the first event.
        for outcome in ROUND_OUTCOMES:
            self.rounds.labels(outcome)
        for action in ("publish", "subscribe"):
            self.broker_denials.labels(action)
        for state in ROUND_AGENT_STATES:
            self.round_agents.labels(state)
        for outcome in UPDATE_OUTCOMES:
            self.updates.labels(outcome)
        for kind, reasons in _REJECT_LABELS.items():
            for reason in reasons:
                self.rejected.labels(kind, reason)
        self._last_checkpoint: float | None = None
        self.checkpoint_age.set_function(self._checkpoint_age)
        self._families: set[str] = set()
        self.info.info({"version": SOFTWARE_VERSION})

    def describe_run(self, federation: str, algorithm: str, aggregator: str) -> None:
        """Show what the coordinator runs in ``fl_coordinator_info`` (dashboards label panels with it)."""
        self.info.info({"version": SOFTWARE_VERSION, "federation": federation, "algorithm": algorithm,
                        "aggregator": aggregator})

    def record_round(self, summary: RoundSummary, *, finished: bool) -> None:
        """Everything a closed round tells the metrics."""
        self.rounds.labels(summary.outcome).inc()
        self.round_duration.observe(summary.duration_s)
        for phase, seconds in (("publish", summary.publish_s), ("collect", summary.collect_s),
                               ("aggregate", summary.aggregate_s), ("checkpoint", summary.checkpoint_s)):
            self.round_phase.labels(phase).observe(seconds or 0.0)
        for state, count in (("selected", summary.selected), ("answered", summary.answered),
                             ("straggling", summary.stragglers), ("dropped", summary.dropouts),
                             ("surplus", summary.surplus)):
            self.round_agents.labels(state).set(count)
        self.agents_answered.inc(summary.answered)
        self.stragglers.inc(summary.stragglers)
        self.dropouts.inc(summary.dropouts)
        self.round_bytes.labels("in").set(summary.bytes_in)
        self.round_bytes.labels("out").set(summary.bytes_out)
        self.run_finished.set(1 if finished else 0)
        self.progressed(summary.closed_at)
        if summary.accuracy is not None and summary.loss is not None:
            self.accuracy.labels("all").set(summary.accuracy)
            self.loss.labels("all").set(summary.loss)
        for statistic, value in (("median", summary.accuracy_median), ("min", summary.accuracy_min),
                                 ("max", summary.accuracy_max)):
            if value is not None:
                self.accuracy_spread.labels(statistic).set(value)
        for family, fs in summary.families.items():
            if fs.accuracy is not None and fs.loss is not None:
                self.accuracy.labels(self.family_label(family)).set(fs.accuracy)
                self.loss.labels(self.family_label(family)).set(fs.loss)

    def _checkpoint_age(self) -> float:
        return float("nan") if self._last_checkpoint is None else time.time() - self._last_checkpoint

    def checkpointed(self, size: int) -> None:
        self._last_checkpoint = time.time()
        self.checkpoint_time.set(self._last_checkpoint)
        self.checkpoint_bytes.set(size)

    def progressed(self, at: float) -> None:
        self.last_progress.set(at)

    def set_online(self, by_device: Mapping[str, int], *, denied: Mapping[str, int] | None = None) -> None:
        """``fl_agents_online`` (and ``fl_agents_denied``): one value per device label, each set once, so a
        scrape never sees a half-updated set."""
        for gauge, counts in ((self.agents_online, by_device), (self.agents_denied, denied)):
            if counts is None:
                continue
            folded = dict.fromkeys((*KNOWN_DEVICES, "other"), 0)
            for device, count in counts.items():
                folded[self.device_label(device)] += count
            for label, count in folded.items():
                gauge.labels(label).set(count)

    def device_label(self, device: str) -> str:
        return device if device in KNOWN_DEVICES else "other"

    def family_label(self, family: str) -> str:
        if family in self._families or family == "all":
            return family
        if len(self._families) < MAX_FAMILY_LABELS:
            self._families.add(family)
            return family
        return "other"
