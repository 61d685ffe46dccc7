"""A whole federation inside one process, for benchmarks that run many back to back.

The coordinator service, any site aggregators and every agent run on threads of their own, each
with its own MQTT connection to a real broker (a site's to its own, bridged to the root's by the
caller): the same classes and the same wire path as separate processes, without paying a torch
import and a data load per agent process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from coordinator.app.service import CoordinatorService
from coordinator.fleet.enrollment import enroll
from coordinator.round.engine import RoundEngine
from coordinator.settings import CoordinatorSettings
from coordinator.sites.service import SiteService
from coordinator.sites.settings import SiteSettings
from coordinator.state.rounds import RoundSummary
from coordinator.strategies.base import Strategy
from edge_agent.agent import EdgeAgent
from edge_agent.attacks import Collusion
from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings
from edge_agent.state import AgentStateDir
from edge_agent.tasks.registry import resolve_task
from service_kit.keys import load_or_create_signing_key


@dataclass
class FederationResult:
    history: list[RoundSummary]
    strategy: Strategy
    """The coordinator's strategy at the end: its ``states`` are the final global states."""
    agents: list[EdgeAgent]
    service: CoordinatorService
    wall_s: float


def run_federation(coordinator: CoordinatorSettings, agents: list[AgentSettings], timeout_s: float = 600.0,
                   on_round_closed: Callable[[RoundSummary, RoundEngine], None] | None = None,
                   collusion: Collusion | None = None, sites: Sequence[SiteSettings] = ()) -> FederationResult:
    """Run until the coordinator finishes; raises TimeoutError after ``timeout_s``.

    ``on_round_closed`` runs on the coordinator's thread after each round is recorded (the
    engine's strategy then holds the states the next round starts from), e.g. to score every
    round's global model; the next round waits for it. ``collusion`` is shared by the agents
    configured with ``attack="alie"`` (benches only). ``sites``: site aggregators, each enrolled at the
    root as ``coordinator enroll`` would, given the root's key and enrollment file (agents of a site
    connect to its broker: their ``broker_url``).
    """
    coordinator = coordinator.model_copy(update={"exit_when_finished": True, "http_port": 0})
    agents = enroll_all(coordinator, agents)
    site_services = [SiteService(enroll_site(coordinator, site), registry=CollectorRegistry()) for site in sites]
    service = CoordinatorService(coordinator, registry=CollectorRegistry())
    if on_round_closed is not None:
        engine, record = service.engine, service.driver.on_round_closed

        def observe(summary: RoundSummary) -> None:
            if record is not None:
                record(summary)
            on_round_closed(summary, engine)

        service.driver.on_round_closed = observe
    try:
        tasks = {name: resolve_task(name) for name in {a.task for a in agents}}  # once, not once per agent
        fleet = [build_agent(a.model_copy(update={"exit_when_finished": True}), set_threads=False,
                             collusion=collusion, task=tasks[a.task]) for a in agents]
    except BaseException:
        service.close()  # never to run: its state directory and port are free again
        raise
    stop = threading.Event()
    started = time.perf_counter()
    coordinator_thread = threading.Thread(target=service.run, args=(stop,), name="coordinator", daemon=True)
    agent_threads = [threading.Thread(target=agent.run, args=(stop,), name=agent.agent_id, daemon=True)
                     for agent in fleet]
    agent_threads += [threading.Thread(target=site.run, args=(stop,), name=site.settings.site_id, daemon=True)
                      for site in site_services]
    coordinator_thread.start()
    for thread in agent_threads:
        thread.start()
    coordinator_thread.join(timeout_s)
    finished = not coordinator_thread.is_alive()
    stop.set()
    coordinator_thread.join(10)
    for thread in agent_threads:
        thread.join(10)
    if not finished:
        raise TimeoutError(f"federation did not finish within {timeout_s:.0f}s "
                           f"(reached round {service.engine.run.next_round - 1})")
    return FederationResult(list(service.rounds_log.read()), service.engine.strategy, fleet, service,
                            time.perf_counter() - started)


def enroll_site(coordinator: CoordinatorSettings, site: SiteSettings) -> SiteSettings:
    """Enroll a site aggregator's key at the root; its settings then pin the root's key and read its enrollment."""
    coordinator_key = load_or_create_signing_key(coordinator.signing_key_path).public_key
    enroll(coordinator.enrollment_path, site.site_id, load_or_create_signing_key(site.signing_key_path).public_key)
    key_file = Path(site.state_dir) / "coordinator.pub"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(coordinator_key.to_text() + "\n")
    return site.model_copy(update={"coordinator_key": key_file, "enrolled_agents_file": coordinator.enrollment_path,
                                   "enrollment": "required"})


def enroll_all(coordinator: CoordinatorSettings, agents: list[AgentSettings]) -> list[AgentSettings]:
    """Enroll every agent with the coordinator, as ``coordinator enroll`` does; the agents' settings
    then pin the coordinator's key."""
    coordinator_key = load_or_create_signing_key(coordinator.signing_key_path).public_key
    enrolled = []
    for settings in agents:
        agent_id = settings.agent_id or AgentStateDir(settings.state_dir).agent_id(settings.device)
        key = load_or_create_signing_key(settings.signing_key_path).public_key
        enroll(coordinator.enrollment_path, agent_id, key)
        enrolled.append(settings.model_copy(update={"agent_id": agent_id, "coordinator_key": coordinator_key.to_text()}))
    return enrolled
