"""The round engine: the only writer of run state, and sans-IO.

Events in, actions out: a message, a clock tick, a connection change or a finished background
job goes in; the actions it produced (publish, save a state file, run a round's aggregation off
the loop, append to the rounds log) come back, in order, for a driver to perform
(``coordinator.app.driver``). The service, the tests and a site aggregator drive the same engine.

Single-threaded by design: one loop feeds it, so it needs no locks; only the background job of
a closing round touches the strategy's states meanwhile, and no round opens until it is applied.

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
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.admission.decisions import Reject
from coordinator.admission.intake import Refused, RosterIn, StatusCleared, StatusIn, UpdateIn
from coordinator.admission.partials import PartialIn
from coordinator.admission.statuses import admit_status
from coordinator.admission.updates import admit_update
from coordinator.round import applying, broadcast, closing, opening, resume, rosters, sites
from coordinator.round.actions import Action
from coordinator.round.closure import Closure
from coordinator.round.parts import EngineParts
from coordinator.round.resume import Saved
from coordinator.round.run_state import RunState
from coordinator.round.secure import SecureRounds
from coordinator.settings import CoordinatorSettings
from coordinator.state.rounds import OpenRound, RoundSummary
from coordinator.strategies.base import Strategy
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.security.signing import SigningKey

log = logging.getLogger(__name__)

GAUGE_REFRESH_S = 1.0


@dataclass(frozen=True)
class Tick:
    wait_s: float
    """How long the driver may wait for input before ticking again."""
    actions: list[Action]


class RoundEngine:
    def __init__(self, settings: CoordinatorSettings, strategy: Strategy, metrics: CoordinatorMetrics, *,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time,
                 signing_key: SigningKey | None = None) -> None:
        self.parts = EngineParts.build(settings, strategy, metrics, clock=clock, wall_clock=wall_clock,
                                       signing_key=signing_key)
        self.run = RunState(session=secrets.token_hex(6))
        if settings.secure_aggregation:
            self.parts.secure = SecureRounds(settings)

    # -- read-only views of the run, for the driver, probes and tests ---------------------
    @property
    def settings(self) -> CoordinatorSettings:
        return self.parts.settings

    @property
    def strategy(self) -> Strategy:
        return self.parts.strategy

    @property
    def open(self) -> OpenRound | None:
        return self.run.open

    @property
    def last_summary(self) -> RoundSummary | None:
        return self.run.last_summary

    @property
    def finished(self) -> bool:
        return self.run.finished

    @property
    def connected(self) -> bool:
        return self.run.connected

    def offline_status(self) -> bytes:
        """The last will: published by the broker if this process dies."""
        return broadcast.offline_status(self.parts, self.run)

    # -- events ---------------------------------------------------------------------------
    def restore(self, saved: Saved) -> list[Action]:
        """Start a new run, or resume the one in ``saved`` (read by the driver from the state directory)."""
        resume.restore(self.parts, self.run, saved)
        m, s, strategy = self.parts.metrics, self.parts.settings, self.parts.strategy
        m.describe_run(s.federation, strategy.algorithm, strategy.aggregator.describe())
        m.rounds_planned.set(s.rounds)
        m.round_deadline.set(s.round_deadline_s)
        m.current_round.set(self.run.current_round)
        if self.run.open is not None:  # a round resumed open keeps the rate it announced
            m.round_learning_rate.set(self.run.open.announcement.training.learning_rate)
        m.run_finished.set(1 if self.run.finished else 0)
        m.progressed(self.parts.wall_clock())
        return self.parts.actions.drain()

    def on_message(self, topic: str, payload: bytes) -> list[Action]:
        parts, run = self.parts, self.run
        if parts.secure is not None and topic.startswith(f"{parts.topics.root}/secagg/"):
            parts.secure.receive(parts, run, topic, payload)  # a secure round's stage message
            return parts.actions.drain()
        floor = parts.policy.oldest_round(run.open.number) if run.open is not None else run.next_round
        inbound = parts.intake.receive(topic, payload, parts.strategy.states, floor)
        if isinstance(inbound, Refused):
            applying.refused(parts, run, inbound)
        elif isinstance(inbound, StatusCleared):
            applying.forget(parts, inbound.agent_id)
        elif isinstance(inbound, StatusIn):
            now = parts.clock()
            decision = admit_status(inbound.status, inbound.agent_id, inbound.signer,
                                    applying.admission_view(parts, run, now))
            applying.apply_status(parts, run, inbound.agent_id, inbound.status, decision, now)
            if not isinstance(decision, Reject):
                parts.rosters.speaks_directly(inbound.agent_id)  # no site's roster may take it while it is live
        elif isinstance(inbound, UpdateIn):
            self._admit(inbound)
        elif isinstance(inbound, PartialIn):  # a site aggregator's fold of its agents' updates
            sites.apply_partial(parts, run, inbound)
        elif isinstance(inbound, RosterIn):  # a site aggregator's agents, in place of their statuses
            rosters.apply_roster(parts, run, inbound)
        return parts.actions.drain()

    def on_connection(self, connected: bool, session_present: bool = True) -> list[Action]:
        """After every (re)connect, republish what must be retained: the broker may have lost it.

        ``session_present`` False after an earlier connect means the broker lost our persistent
        session, and with it the updates it had queued for us: a new session id tells agents
        to send their answer to the open round again.
        """
        parts, run = self.parts, self.run
        run.connected = connected
        parts.metrics.broker_connected.set(1 if connected else 0)
        if not connected:
            return parts.actions.drain()
        if run.ever_connected and not session_present:
            run.session = secrets.token_hex(6)
            log.warning("the broker lost this coordinator's session; agents will resend to session %s", run.session)
        run.ever_connected = True
        broadcast.publish_status(parts, run, "finished" if run.finished else "online")
        broadcast.publish_task(parts, run, force=True)
        parts.retained.reconnected()
        if not run.closing:  # else the states are changing: the next round publishes them
            broadcast.publish_states(parts, run)
        rounds_current = parts.topics.rounds_current
        if run.open is not None:
            parts.publisher.publish(rounds_current, run.open.payload, "round", retain=True)
        elif not run.finished:  # no round open: an announcement still retained is stale (an old run's)
            parts.publisher.publish(rounds_current, b"", "round", retain=True)
        return parts.actions.drain()

    def tick(self) -> Tick:
        """Advance on the clock: close a round that is done, open the next one."""
        parts = self.parts
        now = parts.clock()
        self._refresh_gauges(now)
        wait = self._advance(now)
        if self.run.connected:
            broadcast.publish_task(parts, self.run)  # a family's layout was fixed, or its arrays became known
        return Tick(wait, parts.actions.drain())

    def closed(self, closure: Closure) -> list[Action]:
        """The background job of a closing round is done and its checkpoint written: apply it."""
        closing.finish_close(self.parts, self.run, closure)
        return self.parts.actions.drain()

    # -- internals -----------------------------------------------------------------------
    def _advance(self, now: float) -> float:
        parts, run = self.parts, self.run
        if run.closing:
            return 0.05
        if run.finished:
            return 1.0
        if run.open is None:
            if opening.maybe_open(parts, run, now):
                self._replay_deferred()
            return 0.2
        if parts.secure is not None:
            parts.secure.advance(parts, run, now)
        if parts.policy.closes(run.open, now):
            parts.actions.add(closing.begin_close(parts, run, now, run.open.ending))
            return 0.0
        return max(0.0, min(run.open.deadline - now, 0.5))

    def _admit(self, inbound: UpdateIn) -> None:
        parts, run = self.parts, self.run
        view = applying.admission_view(parts, run, parts.clock())
        applying.apply_update(parts, run, inbound, admit_update(inbound.topic, inbound.update, view, parts.policy))

    def _replay_deferred(self) -> None:
        """Offer the updates held back while the last buffer closed to the one just opened."""
        waiting, self.run.deferred = self.run.deferred, []
        for inbound in waiting:
            self._admit(inbound)

    def _refresh_gauges(self, now: float) -> None:
        parts, run = self.parts, self.run
        if now - run.gauges_refreshed < GAUGE_REFRESH_S:  # tick runs after every message batch
            return
        run.gauges_refreshed = now
        for agent_id in parts.registry.forget_silent(now, parts.settings.forget_agents_after_s):
            applying.let_go(parts, agent_id)
        # Applied versions stay while an update of theirs could still be taken (within max_staleness).
        parts.applied.prune(run.current_round - parts.settings.max_staleness - 1)
        if len(parts.labels) > len(parts.registry):  # the registry evicted some when full
            parts.labels.prune(lambda agent_id: parts.registry.get(agent_id) is not None)
        parts.metrics.set_online(parts.registry.online_by_device(now), denied=parts.registry.denied_by_device(now))
