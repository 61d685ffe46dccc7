"""How long a fleet of agent processes takes to come online: fresh interpreters against forks of a loaded parent.

    python bench/agent_start.py              # 6 and 12 agents
    python bench/agent_start.py --quick      # 3 agents (CI)

Each row starts a fresh Mosquitto and a coordinator that waits for all N agents, then starts the agents
(``launcher.fleet.Fleet``) and times until the coordinator announces round 1, which it does once every agent
has said it is online (each loaded its code and data, built its model and connected). Modes, in one session:

* ``fresh``: each agent a new interpreter (``python -m edge_agent run``), as on a device; the baseline.
* ``forked, cold``: forks of a parent that imports torch and the agent's code first (``launcher/forkserver.py``),
  started inside the row, so its imports are paid once in the row's time.
* ``forked, warm``: the same parent already loaded (as from a fleet's second start on: a test session, a demo
  with sites, an agent restarted after a kill).

CPU is the agents' own (user + system, from /proc when round 1 is announced); a forked agent's excludes the
parent's imports, which ``parent CPU s`` shows once. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from procstat import cpu_seconds

from launcher.broker import MosquittoBroker
from launcher.fleet import Fleet, FleetSpec, default_fleet
from launcher.forked import ForkServer

READY = "round 1 (train): selected"
TIMEOUT_S = 600.0


@dataclass
class Row:
    agents: int
    mode: str
    seconds: float
    agent_cpu_s: float
    parent_cpu_s: float | None


def wait_for_log(path: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.02)
    raise TimeoutError(f"no {text!r} in {path} within {timeout_s:.0f} s")


def one_row(agents: int, mode: str, workdir: Path) -> Row:
    forked = mode != "fresh"
    if mode == "forked, cold":
        ForkServer.close_shared()
    broker = MosquittoBroker(workdir=workdir / "broker").start()
    spec = FleetSpec(default_fleet(agents), task="digits")
    settings = {"rounds": 1, "local_epochs": 1, "min_available_agents": agents, "min_fit_agents": agents,
                "round_deadline_s": TIMEOUT_S, "log_level": "INFO", "evaluate_final": False}
    fleet = Fleet(workdir / "run", broker.url, spec, settings, federation="start", forked=forked)
    log = fleet.coordinator.log_path
    try:
        fleet.start_coordinator()
        wait_for_log(log, "waiting for agents", TIMEOUT_S)
        start = time.monotonic()
        fleet.start_agents()
        wait_for_log(log, READY, TIMEOUT_S)
        seconds = time.monotonic() - start
        agent_cpu = sum(cpu_seconds(p.pid) or 0.0 for p in fleet.agents.values() if p.pid is not None)
        parent = None
        if forked:
            first = next(iter(fleet.agents.values()))
            parent = cpu_seconds(ForkServer.shared(first.argv, first.env).pid) or 0.0
        return Row(agents, mode, seconds, agent_cpu, parent)
    finally:
        fleet.stop()
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="6,12", help="fleet sizes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="3 agents")
    args = parser.parse_args()
    sizes = [3] if args.quick else [int(n) for n in args.agents.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="fl-agent-start-"))
    rows: list[Row] = []
    try:
        for n in sizes:
            for i, mode in enumerate(("fresh", "forked, cold", "forked, warm")):
                rows.append(one_row(n, mode, workdir / f"{n}-{i}"))
    finally:
        ForkServer.close_shared()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"# agents online: {os.cpu_count()} cores, digits task, agents cycling jetson/rpi/phone")
    print("| agents | mode | seconds to all online | ratio to fresh | agents' CPU s | parent CPU s |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r.agents == row.agents and r.mode == "fresh")
        parent = "-" if row.parent_cpu_s is None else f"{row.parent_cpu_s:.1f}"
        print(f"| {row.agents} | {row.mode} | {row.seconds:.2f} | {row.seconds / base.seconds:.2f} | "
              f"{row.agent_cpu_s:.1f} | {parent} |")


if __name__ == "__main__":
    main()
