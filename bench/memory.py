"""Resident memory of real edge agents, per device profile, with and without DP.

    python bench/memory.py            # jetson, rpi, phone and cpu, DP off then on, 2 rounds each
    python bench/memory.py --quick    # the phone profile only, DP off then on, 1 round: for CI

Each DP setting is one federation: a Mosquitto this script starts, the coordinator (``python -m
coordinator run``) and one agent per profile as its own process running the real CLI
(``python -m edge_agent run --device D``, through ``launcher.fleet``), each profile with its own
thread count (no ``--threads``, no OMP_NUM_THREADS), training its task's family for the profile
on an IID share of the digits. The agents exit when the coordinator finishes the run.

Each agent runs under a hook that imports nothing heavy itself: it registers an exit handler and
runs the ``edge_agent`` module as ``python -m`` would; at exit the handler prints the process's
peak RSS (VmHWM from /proc/self/status, the high-water mark of its memory since it started)
and which heavy packages ``sys.modules`` holds. (A parent's ``os.wait4`` rusage would not do:
Linux carries the parent's peak into a forked child's ``ru_maxrss`` across exec.) The ratio
column divides by a bare ``python -c "import torch"`` measured the same way in this session.

Goals (the phone profile, issue 15): peak RSS at most 250 MB without DP, 350 MB with it (MB read
as MiB, 2^20 bytes, as every figure here). The
script exits 0 whatever the numbers (a MISS is printed, not raised); 1 if a run fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from launcher.progress import read_rounds

PROFILES = ("jetson", "rpi", "phone", "cpu")
HEAVY = ("torch", "opacus", "sklearn", "scipy", "pandas", "pyarrow", "matplotlib", "sktime", "mlxtend", "sympy",
         "torch._dynamo")
"""Packages that cost tens of MB resident each (torch._dynamo and sympy: what torch.optim loads on first use)."""
GOALS_MB = {False: 250.0, True: 350.0}
"""The phone profile's peak RSS goal, without and with DP."""
MB = 1024 * 1024

HOOK = (
    "import atexit, sys\n"
    "def _report():\n"
    "    status = open('/proc/self/status').read()\n"
    "    hwm = status.split('VmHWM:')[1].split()[0]\n"
    f"    heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
    "    print(f'memory-probe hwm_kb={hwm} modules={\",\".join(heavy)}', flush=True)\n"
    "atexit.register(_report)\n"
)
"""Prints, at exit, the process's peak RSS (VmHWM) and the heavy modules it imported."""
AGENT = HOOK + "import runpy\nrunpy.run_module('edge_agent', run_name='__main__', alter_sys=True)\n"
"""Runs the agent's CLI as ``python -m edge_agent`` does, under the hook."""
PROBE_LINE = re.compile(r"^memory-probe hwm_kb=(\d+) modules=(.*)$", re.MULTILINE)


@dataclass
class Row:
    profile: str
    dp: bool
    family: str
    peak_rss: int | None
    """Bytes; None when the process could not be measured."""
    modules: list[str] | None
    """Heavy modules loaded at exit; None when the probe did not report (the agent died)."""
    exit_code: int | None


def probe_report(text: str) -> tuple[int, list[str]] | None:
    """(peak RSS in bytes, heavy modules) from the hook's last line in ``text``; None if it never reported."""
    found = PROBE_LINE.findall(text)
    if not found:
        return None
    hwm_kb, modules = found[-1]
    return int(hwm_kb) * 1024, [m for m in modules.split(",") if m]


def measure_command(code: str) -> int:
    """Peak RSS in bytes of ``python -c code`` under the hook (it must exit 0)."""
    done = subprocess.run([sys.executable, "-c", HOOK + code], capture_output=True, text=True, timeout=300,
                          check=False)
    report = probe_report(done.stdout)
    if done.returncode != 0 or report is None:
        raise RuntimeError(f"python -c {code!r} exited with {done.returncode}: {done.stderr[-2000:]}")
    return report[0]


def run_fleet(broker_url: str, run_dir: Path, profiles: tuple[str, ...], dp: bool, rounds: int,
              timeout_s: float) -> list[Row]:
    """One federation, one agent per profile; their rows once every process exited."""
    agents = [AgentSpec(f"{p}-{i}", p, i, settings={"threads": None}) for i, p in enumerate(profiles)]
    dp_settings = {"dp": True, "dp_noise_multiplier": 1.0} if dp else {}
    spec = FleetSpec(agents, partition="iid" if len(agents) > 1 else "none", agent_settings={
        "eval_fraction": 0.1, "heartbeat_s": 5.0, "log_level": "WARNING", **dp_settings})
    coordinator = {"rounds": rounds, "local_epochs": 1, "learning_rate": 0.05, "min_available_agents": len(agents),
                   "min_fit_agents": len(agents), "quorum_fraction": 1.0, "round_deadline_s": timeout_s,
                   "agent_timeout_s": timeout_s, "evaluate_final": False, "log_level": "WARNING"}
    fleet = Fleet(run_dir, broker_url, spec, coordinator, federation=f"memory-{'dp' if dp else 'nodp'}")
    for process in fleet.agents.values():
        process.argv = [fleet.python, "-c", AGENT, *process.argv[3:]]  # argv was python -m edge_agent ...
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # each profile keeps its own thread count
            process.env.pop(name, None)
    deadline = time.monotonic() + timeout_s
    try:
        fleet.start()
        while fleet.coordinator.running and time.monotonic() < deadline:
            time.sleep(0.25)
        rows = []
        for agent in agents:
            process = fleet.agents[agent.name]
            code = process.wait(max(5.0, deadline - time.monotonic()))
            if code is None:
                code = process.terminate()  # SIGTERM: the agent stops cleanly and its hook still reports
            report = probe_report(process.log_path.read_text(errors="replace"))
            rows.append(Row(agent.device, dp, spec.family_of(agent), report[0] if report else None,
                            report[1] if report else None, code))
    finally:
        fleet.stop(timeout_s=5.0)
    closed = len(read_rounds(fleet.rounds_path))
    if closed < rounds or fleet.coordinator.returncode != 0:
        raise RuntimeError(f"the {'DP' if dp else 'no-DP'} run closed {closed} of {rounds} rounds (coordinator exit "
                           f"{fleet.coordinator.returncode}); see {fleet.coordinator.log_path}:\n"
                           f"{fleet.coordinator.log_tail()}")
    return rows


def fmt_mb(value: int | None) -> str:
    return "-" if value is None else f"{value / MB:.0f}"


def table(rows: list[Row], baselines: dict[str, int]) -> list[str]:
    torch_only = baselines["import torch"]
    head = f"{'profile':<8} {'DP':<4} {'family':<10} {'peak RSS MiB':>12} {'x torch':>7} {'heavy':>5}  modules"
    lines = [head, "-" * len(head)]
    for name, peak in baselines.items():
        lines.append(f"{'python -c ' + repr(name):<24} {fmt_mb(peak):>12} {peak / torch_only:>7.2f}")
    for r in rows:
        ratio = "-" if r.peak_rss is None else f"{r.peak_rss / torch_only:.2f}"
        mods = "(no probe report)" if r.modules is None else ", ".join(r.modules) or "none"
        heavy = "-" if r.modules is None else str(len(r.modules))
        lines.append(f"{r.profile:<8} {'on' if r.dp else 'off':<4} {r.family:<10} {fmt_mb(r.peak_rss):>12} "
                     f"{ratio:>7} {heavy:>5}  {mods}")
    return lines


def verdicts(rows: list[Row]) -> list[str]:
    out = []
    for dp, goal in GOALS_MB.items():
        phone = next((r for r in rows if r.profile == "phone" and r.dp == dp), None)
        if phone is None:
            continue
        ok = phone.peak_rss is not None and phone.peak_rss <= goal * MB and phone.exit_code == 0
        out.append(f"{'PASS' if ok else 'MISS'}  phone, DP {'on' if dp else 'off'}: peak RSS {fmt_mb(phone.peak_rss)} MiB "
                   f"(goal <= {goal:.0f} MiB)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the phone profile only, 1 round (for CI)")
    parser.add_argument("--rounds", type=int, default=None, help="training rounds per run; default 2, quick 1")
    parser.add_argument("--profiles", default=None, help=f"comma-separated, of {', '.join(PROFILES)}")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run before giving up")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 2)
    profiles = tuple(p.strip() for p in args.profiles.split(",")) if args.profiles else (
        ("phone",) if args.quick else PROFILES)
    unknown = sorted(set(profiles) - set(PROFILES))
    if unknown:
        parser.error(f"unknown profiles {unknown}; known: {', '.join(PROFILES)}")
    print(f"memory benchmark: python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
          f"profiles {', '.join(profiles)}, {rounds} round(s), DP off then on", flush=True)
    baselines = {"pass": measure_command("pass"), "import torch": measure_command("import torch")}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fl-memory-bench-") as tmp, \
            MosquittoBroker(workdir=Path(tmp) / "broker") as broker:
        for dp in (False, True):
            started = time.monotonic()
            try:
                rows += run_fleet(broker.url, Path(tmp) / ("dp" if dp else "nodp"), profiles, dp, rounds, args.timeout)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print(f"  DP {'on' if dp else 'off'}: {len(profiles)} agents, {time.monotonic() - started:.0f}s",
                  flush=True)
    print()
    print("\n".join(table(rows, baselines)))
    print()
    print("peak RSS: VmHWM of each agent process at exit; x torch: over a bare "
          "'python -c \"import torch\"'; heavy: how many of " + ", ".join(HEAVY) + " it had imported at exit.")
    failed = [r for r in rows if r.exit_code != 0 or r.modules is None]
    for line in verdicts(rows):
        print(line)
    if failed:
        print(f"error: agents failed: {[(r.profile, r.dp, r.exit_code) for r in failed]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
