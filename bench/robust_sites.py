"""Accuracy under attack with sites: the robust rule inside each site, the mean across sites (bench/robust.py --part sites).

Each cell is one federation through the real engines: a root Mosquitto started here, one Mosquitto per site
bridged to it (launcher/sites.py: deploy/mosquitto/site-bridge.conf's topics), the root coordinator, one site
aggregator per site and every agent, on threads of this process (launcher.inprocess). The same agents (the
same IID shares of the digits training pool, the same attackers: the first agent of every site) run three
ways: flat on one coordinator with the rule, with sites folding the rule inside and the root taking the mean
across sites, and with sites folding the plain mean (no defence anywhere). The final global model is scored
on the digits test split that no agent ever sees.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from robust_accuracy import SkipCounter

from coordinator.settings import CoordinatorSettings
from coordinator.sites.settings import SiteSettings
from edge_agent.config import AgentSettings
from edge_agent.data.datasets import Dataset
from edge_agent.tasks.registry import resolve_task
from edge_agent.tasks.splits import pool_and_test
from launcher.broker import MosquittoBroker
from launcher.evaluate import score_weights
from launcher.inprocess import run_federation
from launcher.sites import bridge_settings

GOAL_POINTS = 3.0
ATTACKS = ("none", "sign_flip", "scaling")
WAYS = ("flat, rule at the root", "sites, rule inside", "sites, mean inside")


@dataclass(frozen=True)
class SitesPlan:
    sites: int
    agents_per_site: int
    rounds: int
    rule: str
    local_epochs: int = 2
    learning_rate: float = 0.05
    momentum: float = 0.9
    device: str = "phone"
    deadline_s: float = 5.0

    @property
    def agents(self) -> int:
        return self.sites * self.agents_per_site

    def attacker(self, index: int) -> bool:
        """The first agent of every site: one attacker per site, 1/agents_per_site of the fleet."""
        return index % self.agents_per_site == 0


FULL = SitesPlan(sites=3, agents_per_site=5, rounds=20, rule="median")
QUICK = SitesPlan(sites=2, agents_per_site=3, rounds=3, rule="median", local_epochs=1)


@dataclass
class SitesCell:
    attack: str
    way: str
    accuracy: float | None
    rounds_completed: int
    seconds: float


def run_cell(plan: SitesPlan, root: MosquittoBroker, workdir: Path, attack: str, way: str,
             test_set: Dataset) -> SitesCell:
    federation = f"sites-{time.monotonic_ns()}"
    with_sites = way.startswith("sites")
    # Flat: byzantine_f tolerates every attacker at the root; with sites, one per site.
    f_root, f_site = plan.sites, 1
    coordinator = CoordinatorSettings(
        federation=federation, broker_url=root.url, state_dir=workdir / federation / "root", rounds=plan.rounds,
        local_epochs=plan.local_epochs, learning_rate=plan.learning_rate, momentum=plan.momentum,
        min_available_agents=plan.agents, min_fit_agents=plan.agents, quorum_fraction=0.5,
        round_deadline_s=plan.deadline_s, evaluate_final=False, log_level="WARNING",
        aggregator="mean" if with_sites else plan.rule, byzantine_f=0 if with_sites else f_root,
        max_norm_ratio=0, claim_cap_multiple=0)
    brokers: list[MosquittoBroker] = []
    try:
        if with_sites:
            for s in range(plan.sites):
                brokers.append(MosquittoBroker(workdir=workdir / federation / f"broker-s{s}", settings=bridge_settings(
                    federation, f"s{s}", root.host, root.port, restart_timeout="1 2")).start())
        sites = [SiteSettings(
            federation=federation, broker_url=broker.url, site_id=f"s{s}", state_dir=workdir / federation / f"s{s}",
            rounds=plan.rounds, min_available_agents=1, min_fit_agents=1, round_deadline_s=plan.deadline_s,
            aggregator=plan.rule if way == "sites, rule inside" else "mean", byzantine_f=f_site,
            max_norm_ratio=0, claim_cap_multiple=0, log_level="WARNING") for s, broker in enumerate(brokers)]
        agents = [AgentSettings(
            federation=federation, broker_url=brokers[i // plan.agents_per_site].url if with_sites else root.url,
            device=plan.device, agent_id=f"agent-{i:02d}", state_dir=workdir / federation / f"agent-{i:02d}",
            partition="iid", num_partitions=plan.agents, partition_index=i, heartbeat_s=5.0, log_level="WARNING",
            attack=attack if plan.attacker(i) else "none") for i in range(plan.agents)]
        started = time.perf_counter()
        result = run_federation(coordinator, agents, timeout_s=max(300.0, plan.rounds * plan.deadline_s * 3),
                                sites=sites)
    finally:
        for broker in brokers:
            broker.stop()
    accuracy = None
    if result.strategy.states:
        (family, state), = result.strategy.states.items()
        accuracy = score_weights(family, state.weights, test_set, resolve_task("digits")).accuracy
    return SitesCell(attack, way, accuracy, sum(1 for s in result.history if s.outcome == "completed"),
                     time.perf_counter() - started)


def run(plan: SitesPlan, progress: bool = True) -> list[SitesCell]:
    logging.getLogger().setLevel(logging.ERROR)
    torch.set_num_threads(1)
    _, test_set = pool_and_test(resolve_task("digits"))
    cells = []
    errors = SkipCounter()
    logging.getLogger().addHandler(errors)
    try:
        with tempfile.TemporaryDirectory() as tmp, MosquittoBroker(workdir=Path(tmp) / "root-broker") as root:
            for attack in ATTACKS:
                for way in WAYS:
                    cell = run_cell(plan, root, Path(tmp), attack, way, test_set)
                    cells.append(cell)
                    if progress:
                        acc = "-" if cell.accuracy is None else f"{100 * cell.accuracy:.1f}%"
                        print(f"  {attack:<10} {way:<24} {acc:>6}  {cell.rounds_completed}/{plan.rounds} rounds, "
                              f"{cell.seconds:.1f}s", flush=True)
    finally:
        logging.getLogger().removeHandler(errors)
    return cells


def table(plan: SitesPlan, cells: list[SitesCell]) -> list[str]:
    def acc(attack: str, way: str) -> str:
        cell = next(c for c in cells if (c.attack, c.way) == (attack, way))
        text = "-" if cell.accuracy is None else f"{100 * cell.accuracy:.1f}"
        return text + ("*" if cell.rounds_completed < plan.rounds else "")

    width = max(len(w) for w in WAYS) + 2
    lines = [f"{'attack':<12}" + "".join(f"{w:>{width}}" for w in WAYS), "-" * (12 + width * len(WAYS))]
    for attack in ATTACKS:
        lines.append(f"{attack:<12}" + "".join(f"{acc(attack, w):>{width}}" for w in WAYS))
    return lines


def verdicts(plan: SitesPlan, cells: list[SitesCell]) -> list[tuple[bool, str]]:
    def accuracy(attack: str, way: str) -> float:
        return next(c.accuracy or 0.0 for c in cells if (c.attack, c.way) == (attack, way))

    out = []
    way = "sites, rule inside"
    for attack in ATTACKS[1:]:
        attacked, own, flat = accuracy(attack, way), accuracy("none", way), accuracy("none", WAYS[0])
        worst = max(100 * (own - attacked), 100 * (flat - attacked))
        out.append((worst <= GOAL_POINTS, f"{plan.rule} inside {plan.sites} sites, one {attack} attacker per site: "
                    f"{100 * attacked:.1f}%, {100 * (attacked - own):+.1f} points vs its clean run, "
                    f"{100 * (attacked - flat):+.1f} vs the clean flat run (goal: within {GOAL_POINTS:g} of both)"))
    return out
