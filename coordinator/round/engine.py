"""The round engine: announce, collect, aggregate, checkpoint, publish; one round at a time.

Single-threaded by design: the service feeds it messages and clock ticks from one loop, so
it needs no locks. Nothing here knows about sockets; publishing goes through an ``Outbox``.

A round closes as soon as the wanted number of agents answered (all selected ones, unless
over-selecting), or at its deadline: it aggregates if the quorum answered and is counted as
``quorum_missed`` otherwise. Either way the next round starts; nothing waits forever.

Crash safety: the checkpoint is written after every round and the open round's announcement
when it opens, so a restarted coordinator resumes the same round (or closes it) and never
reuses a round number. Updates it had accepted before the crash are lost with its memory;
agents send them again when they see its new ``session`` re-announce the round.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future

from coordinator.admission.intake import InboundFilter
from coordinator.admission.norms import NormGuard
from coordinator.admission.task_agreement import TaskAgreement
from coordinator.fleet.agents import AgentRegistry
from coordinator.fleet.enrollment import Enrollment
from coordinator.fleet.privacy import FleetPrivacy
from coordinator.fleet.selection import plan_selection
from coordinator.policies import Admission, build_policy
from coordinator.round.closing import Closure, InlineExecutor, aggregate, summarise, with_checkpoint_time
from coordinator.round.publishing import Outbox, Publisher
from coordinator.settings import CoordinatorSettings
from coordinator.state.checkpoint import CheckpointStore
from coordinator.state.retained import RetainedStates
from coordinator.state.rounds import OpenRound, RoundSummary
from coordinator.state.versions import VersionLog
from coordinator.strategies.base import Strategy
from coordinator.telemetry.heterogeneity import HeterogeneityMetrics, LabelSkew
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import AgentStatus, CoordinatorStatus, LocalTraining, RoundAnnouncement, StateRef, Update
from protocol.security.signing import SigningKey
from protocol.topics import Topics
from protocol.version import SOFTWARE_VERSION
from protocol.wire import decode_message, encode_message

log = logging.getLogger(__name__)

GAUGE_REFRESH_S = 1.0
CHECKPOINT = "checkpoint"
OPEN_ROUND = "open_round"


class RoundEngine:
    def __init__(
        self,
        settings: CoordinatorSettings,
        strategy: Strategy,
        outbox: Outbox,
        store: CheckpointStore,
        metrics: CoordinatorMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_round_closed: Callable[[RoundSummary], None] | None = None,
        on_resumed: Callable[[RoundSummary | None], None] | None = None,
        background: Executor | None = None,
        signing_key: SigningKey | None = None,
    ) -> None:
        self.settings = settings
        self.strategy = strategy
        self.outbox = outbox
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.wall_clock = wall_clock
        self.on_round_closed = on_round_closed
        self.on_resumed = on_resumed
        self.background = background or InlineExecutor()
        """Where rounds are aggregated and checkpointed: a thread in the service, inline in unit tests."""
        self.closing: tuple[Closure, Future[Closure]] | None = None
        self.enrollment = Enrollment(settings.enrollment_path, clock) if settings.enrollment == "required" else None
        if self.enrollment is None:
            log.warning("enrollment is open: any client that reaches the broker can join and send updates "
                        "(for experiments only; enroll agents with 'coordinator enroll' and drop --enrollment open)")
        self.norms = NormGuard(settings.max_norm_ratio)
        self.task = TaskAgreement(settings.task_card())
        self.policy = build_policy(settings)
        self.versions = VersionLog(settings.max_staleness)
        self.topics = Topics(settings.federation)
        self.registry = AgentRegistry(settings.agent_timeout_s, settings.max_known_agents)
        self.inbound = InboundFilter(self, metrics)
        self.session = secrets.token_hex(6)
        self.run_id = ""
        self.next_round = 1
        self.last_summary: RoundSummary | None = None
        """The newest closed round; every round's summary goes to ``on_round_closed`` (the rounds log)."""
        self.finished = False
        self.open: OpenRound | None = None
        self.connected = False
        self._ever_connected = False
        self.retained = RetainedStates(store)
        self.out = Publisher(outbox, metrics, self.topics, self.retained, signing_key, settings.max_message_bytes)
        self._last_wait_log = -1e9
        self._gauges_refreshed = -1e9
        self.privacy = FleetPrivacy(metrics)
        self.labels = LabelSkew(self.task.card.num_classes or None)
        """Agents' label counts: the federation's label distribution, KL weighting and skew metrics."""
        self.heterogeneity = HeterogeneityMetrics(metrics.registry, device_label=metrics.device_label)

    # -- start-up --------------------------------------------------------------------
    def restore(self) -> None:
        """Resume from the checkpoint if there is one; otherwise start a new run."""
        self._restore()
        m = self.metrics
        m.describe_run(self.settings.federation, self.strategy.algorithm, self.strategy.aggregator.describe())
        m.rounds_planned.set(self.settings.rounds)
        m.round_deadline.set(self.settings.round_deadline_s)
        m.current_round.set(self.open.number if self.open else max(self.next_round - 1, 0))
        m.run_finished.set(1 if self.finished else 0)
        m.progressed(self.wall_clock())

    def _restore(self) -> None:
        saved = self.store.load(CHECKPOINT)
        self.retained.load()
        if saved is None:
            self.run_id = secrets.token_hex(6)
            self.metrics.checkpointed(self._save_checkpoint(self.next_round, self.finished, None))
            log.info("new run %s: %s with %s, %d rounds", self.run_id, self.strategy.algorithm,
                     self.strategy.aggregator.describe(), self.settings.rounds)
            return
        if saved["algorithm"] != self.strategy.algorithm:
            raise ValueError(
                f"checkpoint in {self.store.directory} is a {saved['algorithm']} run, "
                f"not {self.strategy.algorithm}; use another state_dir to start a new run"
            )
        self.run_id = saved["run_id"]
        self.next_round = int(saved["next_round"])
        self.finished = bool(saved["finished"])
        last = saved.get("last_summary") or (saved["history"][-1] if saved.get("history") else None)  # format of 2026-11
        self.last_summary = None if last is None else RoundSummary.from_dict(last)
        self.strategy.load_state_dict(saved["strategy"])
        self.task.load_state_dict(saved.get("task") or {"name": "digits", "version": "1", "layouts": {}},  # format of 2026-11
                                  str(self.store.directory))
        self.versions.load_state_dict(saved.get("versions") or {})
        self.versions.record(self.strategy.states, self.next_round)
        log.info("resumed run %s at round %d from %s", self.run_id, self.next_round, self.store.directory)
        if self.on_resumed is not None:
            self.on_resumed(self.last_summary)
        self._resume_open_round()

    def _resume_open_round(self) -> None:
        saved = self.store.load(OPEN_ROUND)
        if saved is None or saved["run_id"] != self.run_id or saved["round"] != self.next_round:
            return
        announcement = decode_message(saved["announcement"], RoundAnnouncement)
        now = self.clock()
        age = max(0.0, self.wall_clock() - announcement.issued_at)
        remaining = announcement.deadline_s - age
        wanted = int(saved.get("wanted", len(announcement.selected)))
        if remaining <= 0 and self.settings.resume_grace_s <= 0:
            self.open = OpenRound(announcement, self.out.sealed(saved["announcement"]), now, now - age, wanted)
            self._begin_round(self.open)
            self._close_round(now, ("interrupted", "coordinator restarted after the deadline"))
            return
        # Past its deadline, the round still waits a grace period for the updates the broker queued
        # for us and those agents resend to the new session, rather than throw finished work away.
        remaining = max(remaining, self.settings.resume_grace_s)
        self.open = OpenRound(announcement, self.out.sealed(saved["announcement"]), now + remaining, now - age, wanted)
        self._begin_round(self.open)
        log.info("round %d was open at the restart: collecting for %.1fs more", announcement.round, remaining)

    # -- inputs ----------------------------------------------------------------------
    def on_message(self, topic: str, payload: bytes) -> None:
        self.inbound.handle(topic, payload)

    def forget_agent(self, agent_id: str) -> None:
        """A cleared retained status: the agent was decommissioned."""
        self.registry.forget(agent_id)
        self.privacy.forget(agent_id)
        self.labels.forget(agent_id)

    def observe_labels(self, status: AgentStatus) -> AgentStatus:
        """Keep the status's label counts (ValueError: another label space); the status without them."""
        self.labels.observe_status(status)
        return status if status.label_counts is None else status.model_copy(update={"label_counts": None})

    def observe_agent(self, status: AgentStatus) -> None:
        """Called by the inbound filter for every valid agent status."""
        seen = self.registry.observe(status, self.clock())
        device = self.metrics.device_label(status.device)
        if seen.restarted:
            self.metrics.agent_restarts.labels(device).inc()
        if seen.new_reconnects:
            self.metrics.agent_reconnects.labels(device).inc(seen.new_reconnects)
        if status.state == "offline" and self.open is not None and status.agent_id in self.open.selected_set:
            self.open.went_offline.add(status.agent_id)

    def accept_update(self, update: Update, size: int, norm: float | None = None,
                      admission: Admission | None = None) -> None:
        """Called by the inbound filter for an update that passed every check (``norm``: its delta's)."""
        assert self.open is not None
        admission = admission or Admission()
        if norm is not None:
            self.norms.accepted(update.family, norm)
        if update.task == "train":
            self.metrics.staleness.observe(admission.staleness)
        residual = update.metrics.extra.get("ef_residual_norm")
        if residual is not None:
            self.metrics.residual_norm.set(residual)
        self.open.updates[update.agent_id] = self.strategy.admit(update, admission.weight)
        self.open.bytes_in += size
        self.metrics.updates.labels("accepted").inc()
        record = self.registry.get(update.agent_id)
        self.privacy.observe(update.agent_id, record.status.device if record else "other", update.privacy)
        if update.privacy is not None and update.privacy.exhausted:
            self.registry.budget_spent(update.agent_id, update.privacy)

    def on_connection(self, connected: bool, session_present: bool = True) -> None:
        """After every (re)connect, republish what must be retained: the broker may have lost it.

        ``session_present`` False after an earlier connect means the broker lost our persistent
        session, and with it the updates it had queued for us: a new session id tells agents
        to send their answer to the open round again.
        """
        self.connected = connected
        self.metrics.broker_connected.set(1 if connected else 0)
        if not connected:
            return
        if self._ever_connected and not session_present:
            self.session = secrets.token_hex(6)
            log.warning("the broker lost this coordinator's session; agents will resend to session %s", self.session)
        self._ever_connected = True
        self._publish_status("finished" if self.finished else "online")
        self.retained.reconnected()
        if self.closing is None:  # else the states are changing: the next round publishes them
            self._publish_states()
        if self.open is not None:
            self.out.publish(self.topics.rounds_current, self.open.payload, "round", retain=True)
        elif not self.finished:  # no round open: an announcement still retained is stale (an old run's)
            self.out.publish(self.topics.rounds_current, b"", "round", retain=True)

    def tick(self) -> float:
        """Advance on the clock; returns how long the caller may wait before the next tick."""
        now = self.clock()
        self._refresh_online_gauges(now)
        if self.closing is not None:
            if not self.closing[1].done():
                return 0.05
            self._apply_close()
            return 0.0
        if self.finished:
            return 1.0
        if self.open is None:
            self._maybe_open_round(now)
            return 0.2
        if self.policy.closes(self.open, now):
            self._close_round(now)
            return 0.0
        return max(0.0, min(self.open.deadline - now, 0.5))

    # -- opening -----------------------------------------------------------------------
    def _maybe_open_round(self, now: float) -> None:
        s = self.settings
        number = self.next_round
        task = "train" if number <= s.rounds else "evaluate"
        pool = self.registry.available(now) if task == "train" else self.registry.evaluable(now)
        self.task.pin((r.status for r in pool), {f: st.weights for f, st in self.strategy.states.items()})
        pool = [r for r in pool if self.task.status_problem(r.status) is None]
        available = [r.agent_id for r in pool]
        if not self.connected or len(available) < s.min_available_agents:
            if now - self._last_wait_log > 10.0:
                spent = self.registry.budget_spent_count(now) if task == "train" else 0
                log.info("waiting for agents: %d online, %d needed%s", len(available), s.min_available_agents,
                         f" ({spent} more have spent their privacy budget and train no more)" if spent else "")
                self._last_wait_log = now
            return
        fraction, minimum, over = self.policy.selection(task, s.fraction_fit, s.min_fit_agents, s.over_selection)
        plan = plan_selection(available, number, seed=s.seed, fraction=fraction, minimum=minimum,
                              over_selection=over, maximum=s.max_agents_per_round)
        selected, wanted = plan.selected, self.policy.wanted(task, plan.wanted)
        if len(selected) < min(len(available), math.ceil(fraction * len(available))):
            log.warning("round %d: %d agents available, selecting %d (max_agents_per_round)",
                        number, len(available), len(selected))
        chosen = set(selected)  # once: the pool may hold 50,000 agents and a round select 10,000
        families = {r.status.family for r in pool if r.agent_id in chosen}
        announcement = RoundAnnouncement(
            run_id=self.run_id, round=number, task=task, task_ref=self.task.card.ref,
            layouts={f: self.task.layouts[f] for f in sorted(families)}, algorithm=self.strategy.algorithm,
            training=LocalTraining(epochs=s.local_epochs, learning_rate=s.learning_rate, momentum=s.momentum,
                                   weight_decay=s.weight_decay, batch_size=s.batch_size),
            params=self.strategy.round_params(number), selected=selected,
            states={f: StateRef(family=f, round=st.round, digest=st.digest) for f, st in self.strategy.states.items()},
            init_seed=s.init_seed, issued_at=self.wall_clock(), deadline_s=s.round_deadline_s, last_round=s.rounds,
            compression=s.compression if task == "train" else "none",
        )
        plain = encode_message(announcement)
        self.store.save(OPEN_ROUND, {"run_id": self.run_id, "round": number, "announcement": plain,
                                     "wanted": wanted})
        payload = self.out.sealed(plain)
        self.open = OpenRound(announcement, payload, now + s.round_deadline_s, now, wanted)
        self._begin_round(self.open)
        started = time.perf_counter()
        self.open.bytes_out += self._publish_states()
        self.open.bytes_out += self.out.publish(self.topics.rounds_current, payload, "round", retain=True)
        self._publish_status("online")
        self.open.publish_s = time.perf_counter() - started
        self.metrics.current_round.set(number)
        self.metrics.round_deadline.set(s.round_deadline_s)
        self.metrics.agents_selected.inc(len(selected))
        self.metrics.round_quorum.set(self.open.quorum(s.quorum_fraction, s.min_updates))
        self.metrics.progressed(self.wall_clock())
        log.info("round %d (%s): selected %d of %d agents (%d wanted), deadline %.0fs",
                 number, task, len(selected), len(available), wanted, s.round_deadline_s)
        self.inbound.replay_deferred()

    def _begin_round(self, open_round: OpenRound) -> None:
        self.strategy.begin_round(len(open_round.selected),
                                  memory_budget_bytes=self.settings.aggregation_memory_mb * 1024**2,
                                  spill_dir=self.store.directory / "spill")

    # -- closing -----------------------------------------------------------------------
    def _close_round(self, now: float, ending: tuple[str, str] | None = None) -> None:
        """Decide on the loop what needs the registry and the clock; aggregate and checkpoint in the background.

        The round stops admitting updates here (later ones are late); the next one opens once
        the background job is done and applied.
        """
        open_round = self.open
        assert open_round is not None
        quorum = open_round.quorum(self.settings.quorum_fraction, self.settings.min_updates)
        outcome, reason = ending or ("completed", None)
        if ending is None and len(open_round.updates) < quorum:
            outcome, reason = "quorum_missed", f"{len(open_round.updates)} of {quorum} needed answered"
        missing = set(open_round.selected) - open_round.updates.keys()
        dropouts = {a for a in missing if a in open_round.went_offline or not self.registry.is_online(a, now)}
        # Closed early (enough answered): the rest were over-selected, not late. Asynchronous rounds: still working.
        late = now >= open_round.deadline and self.policy.missing_are_stragglers
        stragglers = missing - dropouts if late else set()
        next_round = open_round.number + 1
        closure = Closure(
            open_round=open_round, outcome=outcome, reason=reason, stragglers=stragglers, dropouts=dropouts,
            surplus=missing - dropouts - stragglers, quorum=quorum, population=self.registry.count_by_family(),
            epsilon_max=self.privacy.epsilon_max, budget_exhausted=self.privacy.exhausted, next_round=next_round,
            finished=open_round.announcement.task == "evaluate" or (
                next_round > self.settings.rounds and not self.settings.evaluate_final),
            closed_at=self.wall_clock(), collect_s=max(0.0, now - open_round.opened),
        )
        self.open = None
        self.next_round = next_round  # updates for the closing round are now late
        self.closing = (closure, self.background.submit(self._aggregate_and_checkpoint, closure))
        if self.closing[1].done():
            self._apply_close()

    def _aggregate_and_checkpoint(self, closure: Closure) -> Closure:
        """The background job: the only code touching the strategy's states and the checkpoint meanwhile."""
        aggregate(closure, self.strategy)
        if self.strategy.rows is not None:
            closure.spilled_bytes = self.strategy.rows.spilled_bytes
        self.strategy.end_round()
        closure.summary = summarise(closure)
        started = time.perf_counter()
        closure.checkpoint_bytes = self._save_checkpoint(closure.next_round, closure.finished, closure.summary)
        closure.checkpoint_s = time.perf_counter() - started
        return closure

    def _apply_close(self) -> None:
        assert self.closing is not None
        closure = self.closing[1].result()  # anything but an AggregationError is a bug: let it stop the process
        self.closing = None
        assert closure.summary is not None
        summary = with_checkpoint_time(closure.summary, closure.checkpoint_s)
        m = self.metrics
        m.checkpointed(closure.checkpoint_bytes)
        m.aggregation_spilled.set(closure.spilled_bytes)
        if closure.failure is not None:
            log.error("round %d failed to aggregate with %s: %s", summary.round, self.strategy.aggregator.describe(),
                      closure.failure)
            m.aggregation_failures.labels(closure.failure.reason).inc()
        elif closure.open_round.announcement.task == "train" and closure.outcome == "completed":
            m.aggregation_duration.observe(closure.aggregate_s)
        for drop in closure.dropped:
            self.inbound.reject("update", drop.reason.value, drop.agent_id, drop.detail)
        self.last_summary = summary
        self.finished = closure.finished
        self.versions.record(self.strategy.states, self.next_round)  # what the next announcement carries
        self.norms.close_round(completed=summary.outcome == "completed" and summary.task == "train")
        self._record(summary, closure.stragglers, closure.dropouts)
        if self.finished:
            self._publish_states()  # the final model, for whoever fetches it
            self._publish_status("finished")
            log.info("run %s finished after round %d", self.run_id, summary.round)

    def _record(self, summary: RoundSummary, stragglers: set[str], dropouts: set[str]) -> None:
        self.metrics.record_round(summary, finished=self.finished)
        self.heterogeneity.update(self.labels, self.settings.kl_temperature if self.settings.weighting == "kl" else None)
        acc = "-" if summary.accuracy is None else f"{summary.accuracy:.4f}"
        log.info("round %d %s: %d/%d answered (%d straggling, %d dropped, %d surplus), accuracy %s, %.1fs%s",
                 summary.round, summary.outcome, summary.answered, summary.selected, len(stragglers),
                 len(dropouts), summary.surplus, acc, summary.duration_s,
                 f" ({summary.reason})" if summary.reason else "")
        if stragglers or dropouts:  # a few names help; ten thousand do not
            log.info("round %d missing: straggling %s, dropped %s", summary.round, _some(stragglers), _some(dropouts))
        if self.on_round_closed is not None:
            self.on_round_closed(summary)

    # -- output ------------------------------------------------------------------------
    def _save_checkpoint(self, next_round: int, finished: bool, last_summary: RoundSummary | None) -> int:
        """What resuming needs, and no more: its size does not grow with the run (the rounds log does)."""
        return self.store.save(CHECKPOINT, {
            "run_id": self.run_id, "algorithm": self.strategy.algorithm, "next_round": next_round,
            "finished": finished, "strategy": self.strategy.state_dict(), "task": self.task.state_dict(),
            "versions": self.versions.state_dict(),
            "last_summary": None if last_summary is None else last_summary.to_dict(),
        })

    def _publish_states(self) -> int:
        return self.out.states(self.strategy.states, self.run_id)

    def _publish_status(self, state: str) -> None:
        self.out.status(self._status(state, self.open.number if self.open else max(self.next_round - 1, 0)))

    def _status(self, state: str, round_number: int) -> CoordinatorStatus:
        return CoordinatorStatus(
            federation=self.settings.federation, run_id=self.run_id or "none", session=self.session, state=state,
            round=round_number, algorithm=self.strategy.algorithm, version=SOFTWARE_VERSION,
            timestamp=self.wall_clock())

    def offline_status(self) -> bytes:
        """The last will: published by the broker if this process dies."""
        return self.out.sealed(encode_message(self._status("offline", max(self.next_round - 1, 0))))

    def _refresh_online_gauges(self, now: float) -> None:
        if now - self._gauges_refreshed < GAUGE_REFRESH_S:  # tick runs after every message batch
            return
        self._gauges_refreshed = now
        for agent_id in self.registry.forget_silent(now, self.settings.forget_agents_after_s):
            self.privacy.forget(agent_id)
        if len(self.labels) > len(self.registry):  # the registry evicted some when full
            self.labels.prune(lambda agent_id: self.registry.get(agent_id) is not None)
        self.metrics.set_online(self.registry.online_by_device(now))


def _some(agents: set[str], shown: int = 20) -> str:
    names = sorted(agents)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
