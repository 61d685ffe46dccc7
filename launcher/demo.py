"""``fl-demo``: the whole system on one machine: a broker, a coordinator and a mixed fleet of agents.

Every part runs as its own process (as on real devices); this launcher only starts them,
watches the coordinator's round log, and writes the report when the run ends.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any

import typer
from rich.console import Console

from coordinator.settings import CoordinatorSettings
from coordinator.state.rounds import RoundSummary
from coordinator.strategies.registry import ALGORITHMS
from edge_agent.config import AgentSettings
from edge_agent.stragglers import parse_delay
from launcher import report
from launcher.broker import BrokerError, EmbeddedBroker, LocalBroker, MosquittoBroker
from launcher.evaluate import CentralEvaluation, central_evaluation
from launcher.fleet import DEVICES, Fleet, FleetSpec, default_fleet
from launcher.progress import ProgressView, fmt_accuracy, human_bytes, read_rounds
from launcher.sites import DemoSites, sites_line, sites_table
from service_kit.settings import ConfigError, load_settings

# Tuned on a 2-core machine (6 agents, Dirichlet alpha=1.0, digits, seed 0):
# * 8 local epochs: each agent holds ~200 samples, so epochs are cheap and cut the rounds needed;
# * lr 0.02: at 0.05 (momentum 0.9) cnn_large oscillates between rounds and ends ~5 points lower;
# * 5% held out per agent (not the agents' 15%): each family model learns only from its own
#   agents (~1/3 of the data with an even mix), so every sample counts; the demo scores the
#   final models on the untouched central test set anyway.
DEFAULT_LOCAL_EPOCHS = 8
DEFAULT_LEARNING_RATE = 0.02
DEFAULT_EVAL_FRACTION = 0.05


class Partition(str, Enum):
    iid = "iid"
    dirichlet = "dirichlet"
    classes = "classes"
    none = "none"


Algorithm = Enum("Algorithm", {name: name for name in ALGORITHMS.names()}, type=str)  # type: ignore[misc]
"""The coordinator's registered algorithms (coordinator/strategies/registry.py)."""


class AggregatorKind(str, Enum):
    """Rules that need no Byzantine count; krum and multi_krum are for the coordinator's CLI."""

    mean = "mean"
    median = "median"
    trimmed_mean = "trimmed_mean"


class BrokerKind(str, Enum):
    amqtt = "amqtt"
    mosquitto = "mosquitto"


@dataclass
class DemoConfig:
    agents: int = 6
    rounds: int = 20
    partition: str = "dirichlet"
    alpha: float = 1.0
    broker_url: str | None = None
    embedded: str = "amqtt"
    out: Path | None = None
    local_epochs: int = DEFAULT_LOCAL_EPOCHS
    learning_rate: float = DEFAULT_LEARNING_RATE
    momentum: float | None = None
    """None: the coordinator's default for the algorithm (0.9, or 0 for SCAFFOLD)."""
    algorithm: str = "fedavg"
    aggregator: str = "mean"
    batch_size: int | None = None
    deadline_s: float = 30.0
    seed: int = 0
    timeout_s: float = 900.0
    devices: list[str] = field(default_factory=lambda: list(DEVICES))
    eval_fraction: float = DEFAULT_EVAL_FRACTION
    min_accuracy: float = 0.0
    stragglers: str = "off"
    """Agents' simulated extra training time (edge-agent ``straggler_delay``), e.g. ``profile``."""
    over_selection: float = 0.0
    dp_epsilon: float | None = None
    """DP-SGD on every agent, its noise calibrated to reach this epsilon (delta 1e-5) after the run's rounds."""
    task: str = "digits"
    """The task the fleet trains, on its built-in set (digits, mnist-5k, basic-motions or an installed one)."""
    sites: int = 0
    secure: bool = False
    """Secure aggregation (SecAgg+): the coordinator, and behind sites each site, learns only sums."""
    """Sites: a Mosquitto each, bridged to the root's (then a Mosquitto too), a site aggregator each; 0: none."""


@dataclass
class DemoResult:
    ok: bool
    reason: str
    run_dir: Path
    wall_s: float
    rounds: list[RoundSummary]
    evaluation: CentralEvaluation | None
    files: dict[str, Path]


class _Interrupted(Exception):
    pass


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(signal.Signals(signum).name)


def _start_broker(config: DemoConfig, run_dir: Path, console: Console) -> LocalBroker | None:
    if config.broker_url:
        return None
    if config.embedded == "amqtt" and not config.sites:  # a site's Mosquitto bridges to a Mosquitto
        try:
            return EmbeddedBroker().start()
        except BrokerError as exc:  # fall back to a real broker rather than fail the demo
            console.print(f"[yellow]embedded amqtt broker failed ({exc}); trying mosquitto[/]")
    return MosquittoBroker(workdir=run_dir / "broker").start()


def coordinator_settings(config: DemoConfig) -> dict[str, Any]:
    return {
        "rounds": config.rounds, "local_epochs": config.local_epochs, "learning_rate": config.learning_rate,
        "momentum": config.momentum, "batch_size": config.batch_size, "round_deadline_s": config.deadline_s,
        "seed": config.seed, "init_seed": config.seed, "algorithm": config.algorithm, "aggregator": config.aggregator,
        # The whole fleet joins before round 1, so every family bootstraps from all its agents.
        "min_available_agents": config.agents, "min_fit_agents": min(2, config.agents),
        "agent_timeout_s": max(90.0, 3 * config.deadline_s), "over_selection": config.over_selection,
        # Over-selecting needs room: want 1/(1+X) of the fleet, so that asking X more asks everyone.
        "fraction_fit": 1.0 / (1.0 + config.over_selection),
        # SecAgg+ leaves the coordinator no individual update to bound: agents clip on the device instead.
        # Stages close as soon as every agent answered; their deadline leaves most of the round to training.
        **({"secure_aggregation": True, "max_norm_ratio": 0, "claim_cap_multiple": 0,
            "secagg_stage_s": max(1.0, config.deadline_s / 6)} if config.secure else {}),
    }


def agent_settings(config: DemoConfig) -> dict[str, Any]:
    settings: dict[str, Any] = {"eval_fraction": config.eval_fraction, "straggler_delay": config.stragglers}
    if config.dp_epsilon is not None:
        settings |= {"dp": True, "dp_target_epsilon": config.dp_epsilon, "dp_planned_rounds": config.rounds}
    return settings


def check_settings(config: DemoConfig) -> None:
    """What the coordinator and the agents would refuse, refused before anything starts (typer.BadParameter)."""
    if config.algorithm == "fedproto" and config.dp_epsilon is not None:
        raise typer.BadParameter("DP-SGD with a target epsilon trains weights; FedProto's rounds send prototypes, "
                                 "which it does not noise", param_hint="--dp-epsilon")
    try:
        load_settings(CoordinatorSettings, None, {**coordinator_settings(config), "task": config.task})
        load_settings(AgentSettings, None, {**agent_settings(config), "task": config.task, "device": config.devices[0]})
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


def federation_name(run_dir: Path) -> str:
    """One federation per run directory: on a shared broker, an earlier run's retained 'finished'
    status and global states would otherwise reach this run's agents (and stop them at once)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", run_dir.resolve().name)[:64].lstrip("-_.")
    return name or "demo"


def run_demo(config: DemoConfig, console: Console | None = None) -> DemoResult:
    console = console or Console()
    run_dir = Path(config.out or Path("runs") / f"demo-{datetime.now():%Y%m%d-%H%M%S}")
    if run_dir.exists() and any(run_dir.iterdir()):
        # The coordinator would resume the old run's checkpoint instead of starting a new one.
        raise typer.BadParameter(f"{run_dir} is not empty; choose another --out", param_hint="--out")
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = FleetSpec(default_fleet(config.agents, config.devices), task=config.task, partition=config.partition,
                     alpha=config.alpha, data_seed=config.seed, threads=1, agent_settings=agent_settings(config))
    started = time.monotonic()
    broker = _start_broker(config, run_dir, console)
    broker_url = config.broker_url or (broker.url if broker else "")
    broker_name = getattr(broker, "name", "external")
    console.print(f"run directory [bold]{run_dir}[/], broker {broker_name} at {broker_url}, "
                  f"{config.agents} agents ({', '.join(sorted({a.device for a in spec.agents}))}), "
                  f"{config.rounds} rounds")
    coordinator = coordinator_settings(config)
    if broker is not None and broker.mqtt_version != "auto":  # amqtt speaks MQTT 3.1.1 only (launcher/broker.py)
        spec.agent_settings["mqtt_version"] = coordinator["mqtt_version"] = broker.mqtt_version
    sites = DemoSites.plan(run_dir, federation_name(run_dir), config.sites, broker_url) if config.sites else None
    if sites is not None:
        spec.agents = sites.deal(spec.agents)
    fleet = Fleet(run_dir, broker_url, spec, coordinator, federation=federation_name(run_dir))
    reason = ""
    previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        fleet.start_coordinator()
        if sites is not None:
            sites.start(fleet, {"task": fleet.coordinator_settings["task"], "algorithm": config.algorithm})
        fleet.start_agents()
        reason = _watch(fleet, config, console, started, sites)
    except _Interrupted as exc:
        reason = f"interrupted ({exc}): stopped every process"
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if any(p.running for p in fleet.processes()):
            fleet.stop(timeout_s=5.0)
        if sites is not None:
            sites.stop()
        if broker is not None:
            broker.stop()
    wall_s = time.monotonic() - started
    return _finish(config, fleet, spec, run_dir, reason, wall_s, broker_name, broker_url, console, sites)


def _watch(fleet: Fleet, config: DemoConfig, console: Console, started: float, sites: DemoSites | None) -> str:
    """Follow the run until the coordinator exits; returns why it failed, or '' on success."""
    def status() -> str:
        alive = sum(1 for a in fleet.agents.values() if a.running)
        done = len(view.rounds)
        return (f"{alive}/{len(fleet.agents)} agents running" + ("" if done else ", waiting for round 1")
                + (f" | {sites_line(view.rounds)}" if sites is not None and done else ""))

    view = ProgressView(fleet.rounds_path, config.rounds, console=console, status=status)
    deadline = started + config.timeout_s
    warned: set[str] = set()
    with view:
        while fleet.coordinator.running:
            view.poll()
            for agent in [*fleet.agents.values(), *(sites.processes() if sites else [])]:
                if not agent.running and agent.name not in warned and agent.returncode != 0:
                    warned.add(agent.name)
                    console.print(f"[red]agent {agent.name} exited with {agent.returncode}; "
                                  f"log {agent.log_path}[/]\n{agent.log_tail(8)}")
            if time.monotonic() > deadline:
                return f"timed out after {config.timeout_s:.0f}s: stopped every process"
            time.sleep(0.25)
        view.poll()
    code = fleet.coordinator.returncode
    if code != 0:
        return f"coordinator exited with {code}; see {fleet.coordinator.log_path}:\n{fleet.coordinator.log_tail()}"
    for agent in fleet.agents.values():  # agents exit once they see the retained 'finished' status
        agent.wait(max(0.1, min(15.0, deadline - time.monotonic())))
    return ""


def _finish(config: DemoConfig, fleet: Fleet, spec: FleetSpec, run_dir: Path, reason: str, wall_s: float,
            broker_name: str, broker_url: str, console: Console, sites: DemoSites | None = None) -> DemoResult:
    rounds = read_rounds(fleet.rounds_path)
    trained = [r for r in rounds if r.task == "train"]
    completed = [r for r in trained if r.outcome == "completed"]
    if not reason and len(trained) < config.rounds:
        reason = f"only {len(trained)} of {config.rounds} training rounds ran"
    if not reason and not completed:
        reason = "no training round completed"
    evaluation = None
    try:
        evaluation = central_evaluation(fleet.coordinator_dir, [spec.family_of(a) for a in spec.agents],
                                        task=spec.task, data=spec.data, data_seed=spec.data_seed)
    except Exception as exc:  # noqa: BLE001 - report what we have
        console.print(f"[red]central evaluation failed: {exc}[/]")
    if not reason and evaluation is not None and (evaluation.overall_accuracy or 0.0) < config.min_accuracy:
        reason = f"overall accuracy {fmt_accuracy(evaluation.overall_accuracy)} is below --min-accuracy {config.min_accuracy}"
    run_info = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "broker": broker_name, "broker_url": broker_url, "federation": fleet.federation, "wall_time_s": round(wall_s, 2),
        "training_time_s": round(_training_time(rounds), 2), "ok": not reason, "reason": reason or None,
        "coordinator_settings": coordinator_settings(config),
        "processes": {p.name: {"exit_code": p.returncode, "log": str(p.log_path)}
                      for p in [*fleet.processes(), *(sites.processes() if sites else [])]},
        "sites": sites.agents if sites else None,
    }
    skew = report.label_skew(spec)
    files = {
        "rounds.csv": report.write_csv(rounds, run_dir / "rounds.csv"),
        "report.json": report.write_json(run_dir / "report.json", run=run_info, rounds=rounds, fleet=skew,
                                         evaluation=evaluation),
    }
    if trained:
        files["accuracy.png"] = report.plot(rounds, run_dir / "accuracy.png", evaluation)
    if sites is not None:
        console.print(sites_table(sites, rounds))
    _print_summary(console, config, skew, rounds, evaluation, wall_s, files, reason)
    return DemoResult(not reason, reason, run_dir, wall_s, rounds, evaluation, files)


def _training_time(rounds: list[RoundSummary]) -> float:
    """From the first round's opening to the last round's close (excludes process start-up)."""
    if not rounds:
        return 0.0
    return rounds[-1].closed_at - (rounds[0].closed_at - rounds[0].duration_s)


def _print_summary(console: Console, config: DemoConfig, skew: list[dict[str, Any]], rounds: list[RoundSummary],
                   evaluation: CentralEvaluation | None, wall_s: float, files: dict[str, Path], reason: str) -> None:
    console.print()
    console.print(report.fleet_table(skew))
    if rounds:
        console.print(report.summary_table(rounds, config.rounds))
    if evaluation is not None:
        console.print(report.central_table(evaluation))
    totals = report.byte_totals(rounds)
    console.print(f"wall time {wall_s:.1f}s (rounds {_training_time(rounds):.1f}s); "
                  f"bytes out {human_bytes(totals['bytes_out'])} ({human_bytes(totals['bytes_out_per_round'])}/round), "
                  f"in {human_bytes(totals['bytes_in'])} ({human_bytes(totals['bytes_in_per_round'])}/round) "
                  f"over {totals['all_rounds']} rounds")
    privacy = report.privacy_totals(rounds)
    if privacy is not None:
        console.print(f"differential privacy: largest epsilon spent by an agent {privacy['epsilon_max']:.4g} "
                      f"(delta 1e-5), {privacy['budget_exhausted_agents']} agent(s) with the budget spent")
    for name, path in files.items():
        console.print(f"  {name:<13} {path}")
    if reason:
        console.print(f"[bold red]run failed: {reason}[/]")
    else:
        console.print("[bold green]run finished[/]")


app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def demo(
    agents: int = typer.Option(6, "--agents", min=1, help="fleet size; devices cycle jetson, rpi, phone"),
    rounds: int = typer.Option(20, "--rounds", min=1, help="training rounds (a final evaluation round follows)"),
    partition: Partition = typer.Option(Partition.dirichlet, "--partition", help="how the data is split over agents"),
    alpha: float = typer.Option(1.0, "--alpha", min=0.001, help="Dirichlet concentration; smaller is more skewed"),
    broker: str | None = typer.Option(None, "--broker", help="broker URL; default: start one here"),
    embedded: BrokerKind = typer.Option(BrokerKind.amqtt, "--embedded", help="broker to start without --broker"),
    out: Path | None = typer.Option(None, "--out", help="run directory [default: runs/demo-<timestamp>]"),
    local_epochs: int = typer.Option(DEFAULT_LOCAL_EPOCHS, "--local-epochs", min=1),
    learning_rate: float = typer.Option(DEFAULT_LEARNING_RATE, "--learning-rate", min=1e-6),
    momentum: float | None = typer.Option(None, "--momentum", min=0.0, max=0.999,
                                          help="local SGD momentum [default: 0.9, or 0 for scaffold]"),
    algorithm: Algorithm = typer.Option(Algorithm("fedavg"), "--algorithm", help="federated algorithm"),  # type: ignore[valid-type]
    aggregator: AggregatorKind = typer.Option(AggregatorKind.mean, "--aggregator",
                                              help="how updates are combined (robust rules: median, trimmed_mean)"),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="default: each device profile's"),
    deadline: float = typer.Option(30.0, "--deadline", min=1.0, max=86_400.0, help="round deadline in seconds"),
    seed: int = typer.Option(0, "--seed", min=0, help="data split, model init and selection seed"),
    timeout: float = typer.Option(900.0, "--timeout", min=10.0, help="give up (and stop everything) after this"),
    devices: str = typer.Option(",".join(DEVICES), "--devices", help="comma-separated device profiles to cycle"),
    eval_fraction: float = typer.Option(DEFAULT_EVAL_FRACTION, "--eval-fraction", min=0.0, max=0.9,
                                        help="share of each agent's data held out for the per-round federated score"),
    min_accuracy: float = typer.Option(0.0, "--min-accuracy", min=0.0, max=1.0,
                                       help="fail unless the overall central test accuracy reaches this"),
    stragglers: str = typer.Option("off", "--stragglers", help=(
        "simulated slow devices: off, profile (each device class's delay distribution), or a distribution "
        "such as lognormal:5,0.8 (see edge-agent --straggler-delay)")),
    over_selection: float = typer.Option(0.0, "--over-selection", min=0.0, max=10.0,
                                         help="want 1/(1+X) of the fleet's updates per round, ask X more "
                                              "agents, and close each round once the wanted number answered"),
    task: str = typer.Option("digits", "--task", help="the task the fleet trains on its built-in data: digits, "
                                                     "mnist-5k, basic-motions, or an installed one ('edge-agent tasks')"),
    dp_epsilon: float | None = typer.Option(None, "--dp-epsilon", min=0.01,
                                            help="train with DP-SGD, the noise calibrated to reach this epsilon "
                                                 "(delta 1e-5) after --rounds; budgets are kept per agent"),
    sites: int = typer.Option(0, "--sites", min=0, max=20, help=(
        "deal the agents to this many sites: a Mosquitto each, bridged to a root Mosquitto, and a site aggregator "
        "each (fedavg, fedprox or scaffold, mean)")),
    secure: bool = typer.Option(False, "--secure", help=(
        "secure aggregation (SecAgg+): the coordinator learns only each round's sum (behind --sites, each site "
        "serves its own agents' sessions and sends up their sum); needs the mean")),
) -> None:
    """Run a federated training demo on this machine and write a report."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from edge_agent.profiles import PROFILES  # the devices agents know (loads torch, as the evaluation will)

    kinds = [d.strip() for d in devices.split(",") if d.strip()]
    unknown = sorted(set(kinds) - set(PROFILES))
    if unknown or not kinds:
        raise typer.BadParameter(f"unknown device(s) {', '.join(unknown) or '(none)'}", param_hint="--devices")
    if secure and aggregator != AggregatorKind.mean:
        raise typer.BadParameter("secure aggregation releases only sums: it needs --aggregator mean", param_hint="--secure")
    if sites and aggregator != AggregatorKind.mean:
        raise typer.BadParameter("the demo's site aggregators fold under the mean", param_hint="--sites")
    try:
        parse_delay(stragglers, "cpu")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--stragglers") from None
    config = DemoConfig(agents=agents, rounds=rounds, partition=partition.value, alpha=alpha, broker_url=broker,
                        embedded=embedded.value, out=out, local_epochs=local_epochs, learning_rate=learning_rate,
                        momentum=momentum, batch_size=batch_size, deadline_s=deadline, seed=seed, timeout_s=timeout,
                        devices=kinds, eval_fraction=eval_fraction, min_accuracy=min_accuracy,
                        stragglers=stragglers, over_selection=over_selection,
                        dp_epsilon=dp_epsilon, algorithm=algorithm.value, aggregator=aggregator.value, task=task,
                        sites=sites, secure=secure)
    check_settings(config)
    # Not a terminal (CI logs, pipes): rich would wrap tables at 80 columns.
    console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)
    try:
        result = run_demo(config, console)
    except BrokerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(0 if result.ok else 1)


def main() -> None:
    app()
