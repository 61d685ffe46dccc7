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
peak RSS (VmHWM from /proc/self/status, the high-water mark of its memory since it started), its
RSS at exit split into anonymous memory (Python objects, torch's tables: only swap could move
it) and file-backed pages (library code and data: clean copies the kernel can reclaim), and
which heavy packages ``sys.modules`` holds.

Every federation runs twice: with the agent's default ``give_back_library_pages`` (at start-up
it unmaps the clean library pages each phase left resident, edge_agent/resident.py) and with it
off, so the table shows what that setting changes and what it does not (the anonymous part). (A parent's ``os.wait4`` rusage would not do:
Linux carries the parent's peak into a forked child's ``ru_maxrss`` across exec.) The ratio
column divides by a bare ``python -c "import torch"`` measured the same way in this session.

Goals (the phone profile, issue 15, judged on the default setting): peak RSS at most 250 MB
without DP, 350 MB with it (MB read as MiB, 2^20 bytes, as every figure here). The
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
    "    kb = {k: status.split(k + ':')[1].split()[0] for k in ('VmHWM', 'VmRSS', 'RssAnon', 'RssFile')}\n"
    f"    heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
    "    print(f'memory-probe hwm_kb={kb[\"VmHWM\"]} rss_kb={kb[\"VmRSS\"]} anon_kb={kb[\"RssAnon\"]} '\n"
    "          f'file_kb={kb[\"RssFile\"]} modules={\",\".join(heavy)}', flush=True)\n"
    "atexit.register(_report)\n"
)
"""Prints, at exit, the process's peak RSS (VmHWM), its RSS then (all, anonymous, file) and the heavy modules it imported."""
AGENT = HOOK + "import runpy\nrunpy.run_module('edge_agent', run_name='__main__', alter_sys=True)\n"
"""Runs the agent's CLI as ``python -m edge_agent`` does, under the hook."""
PROBE_LINE = re.compile(r"^memory-probe hwm_kb=(\d+) rss_kb=(\d+) anon_kb=(\d+) file_kb=(\d+) modules=(.*)$",
                        re.MULTILINE)


@dataclass(frozen=True)
class Probe:
    """What the hook printed at exit, in bytes."""

    peak: int
    """VmHWM: the most the process held resident at any time."""
    rss: int
    anon: int
    """RssAnon at exit: anonymous memory, which only swap could move."""
    file: int
    """RssFile at exit: file-backed pages (library code and data), which the kernel can reclaim."""
    modules: list[str]


@dataclass
class Row:
    profile: str
    dp: bool
    give_back: bool
    """The agent's ``give_back_library_pages`` setting in this run."""
    family: str
    probe: Probe | None
    """None when the agent died before its hook could report."""
    exit_code: int | None


def probe_report(text: str) -> Probe | None:
    """The hook's last report in ``text``; None if it never reported."""
    found = PROBE_LINE.findall(text)
    if not found:
        return None
    *kbs, modules = found[-1]
    peak, rss, anon, file = (int(kb) * 1024 for kb in kbs)
    return Probe(peak, rss, anon, file, [m for m in modules.split(",") if m])


def measure_command(code: str) -> Probe:
    """The hook's report for ``python -c code`` (it must exit 0)."""
    done = subprocess.run([sys.executable, "-c", HOOK + code], capture_output=True, text=True, timeout=300,
                          check=False)
    report = probe_report(done.stdout)
    if done.returncode != 0 or report is None:
        raise RuntimeError(f"python -c {code!r} exited with {done.returncode}: {done.stderr[-2000:]}")
    return report


def run_fleet(broker_url: str, run_dir: Path, profiles: tuple[str, ...], dp: bool, give_back: bool, rounds: int,
              timeout_s: float) -> list[Row]:
    """One federation, one agent per profile; their rows once every process exited."""
    agents = [AgentSpec(f"{p}-{i}", p, i, settings={"threads": None}) for i, p in enumerate(profiles)]
    dp_settings = {"dp": True, "dp_noise_multiplier": 1.0} if dp else {}
    spec = FleetSpec(agents, partition="iid" if len(agents) > 1 else "none", agent_settings={
        "eval_fraction": 0.1, "heartbeat_s": 5.0, "log_level": "WARNING", "give_back_library_pages": give_back,
        **dp_settings})
    coordinator = {"rounds": rounds, "local_epochs": 1, "learning_rate": 0.05, "min_available_agents": len(agents),
                   "min_fit_agents": len(agents), "quorum_fraction": 1.0, "round_deadline_s": timeout_s,
                   "agent_timeout_s": timeout_s, "evaluate_final": False, "log_level": "WARNING"}
    name = f"{'dp' if dp else 'nodp'}-{'give-back' if give_back else 'keep'}"
    # Fresh interpreters, as on a device: a forked agent would start from its parent's pages and peak.
    fleet = Fleet(run_dir / name, broker_url, spec, coordinator, federation=f"memory-{name}", forked=False)
    for process in fleet.agents.values():
        process.argv = [fleet.python, "-c", AGENT, *process.argv[3:]]  # argv was python -m edge_agent ...
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # each profile keeps its own thread count
            process.env.pop(var, None)
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
            rows.append(Row(agent.device, dp, give_back, spec.family_of(agent), report, code))
    finally:
        fleet.stop(timeout_s=5.0)
    closed = len(read_rounds(fleet.rounds_path))
    if closed < rounds or fleet.coordinator.returncode != 0:
        raise RuntimeError(f"the {name} run closed {closed} of {rounds} rounds (coordinator exit "
                           f"{fleet.coordinator.returncode}); see {fleet.coordinator.log_path}:\n"
                           f"{fleet.coordinator.log_tail()}")
    return rows


def fmt_mb(value: int | None) -> str:
    return "-" if value is None else f"{value / MB:.0f}"


def table(rows: list[Row], baselines: dict[str, Probe]) -> list[str]:
    torch_only = baselines["import torch"].peak
    head = (f"{'profile':<8} {'DP':<4} {'give back':<9} {'family':<10} {'peak RSS MiB':>12} {'x torch':>7} "
            f"{'end RSS':>7} {'anon':>5} {'file':>5} {'heavy':>5}  modules")
    lines = [head, "-" * len(head)]
    for name, p in baselines.items():
        lines.append(f"{'python -c ' + repr(name):<34} {fmt_mb(p.peak):>12} {p.peak / torch_only:>7.2f} "
                     f"{fmt_mb(p.rss):>7} {fmt_mb(p.anon):>5} {fmt_mb(p.file):>5}")
    for r in sorted(rows, key=lambda r: (r.dp, PROFILES.index(r.profile), not r.give_back)):
        p = r.probe
        cells = (["-"] * 6 if p is None else
                 [fmt_mb(p.peak), f"{p.peak / torch_only:.2f}", fmt_mb(p.rss), fmt_mb(p.anon), fmt_mb(p.file),
                  str(len(p.modules))])
        mods = "(no probe report)" if p is None else ", ".join(p.modules) or "none"
        lines.append(f"{r.profile:<8} {'on' if r.dp else 'off':<4} {'on' if r.give_back else 'off':<9} {r.family:<10} "
                     f"{cells[0]:>12} {cells[1]:>7} {cells[2]:>7} {cells[3]:>5} {cells[4]:>5} {cells[5]:>5}  {mods}")
    return lines


def verdicts(rows: list[Row]) -> list[str]:
    """PASS or MISS for the phone profile under the default setting (pages given back)."""
    out = []
    for dp, goal in GOALS_MB.items():
        phone = next((r for r in rows if r.profile == "phone" and r.dp == dp and r.give_back), None)
        if phone is None:
            continue
        peak = None if phone.probe is None else phone.probe.peak
        ok = peak is not None and peak <= goal * MB and phone.exit_code == 0
        out.append(f"{'PASS' if ok else 'MISS'}  phone, DP {'on' if dp else 'off'}: peak RSS {fmt_mb(peak)} MiB "
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
          f"profiles {', '.join(profiles)}, {rounds} round(s), DP off then on, library pages given back then kept",
          flush=True)
    baselines = {"pass": measure_command("pass"), "import torch": measure_command("import torch")}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fl-memory-bench-") as tmp, \
            MosquittoBroker(workdir=Path(tmp) / "broker") as broker:
        for dp in (False, True):
            for give_back in (True, False):
                started = time.monotonic()
                try:
                    rows += run_fleet(broker.url, Path(tmp), profiles, dp, give_back, rounds, args.timeout)
                except RuntimeError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return 1
                print(f"  DP {'on' if dp else 'off'}, pages {'given back' if give_back else 'kept'}: "
                      f"{len(profiles)} agents, {time.monotonic() - started:.0f}s", flush=True)
    print()
    print("\n".join(table(rows, baselines)))
    print()
    print("peak RSS: VmHWM of each agent process at exit; x torch: over a bare 'python -c \"import torch\"'; "
          "end RSS, anon, file: its RSS at exit, and the anonymous and file-backed parts of it; give back: the "
          "agent's give_back_library_pages setting; heavy: how many of " + ", ".join(HEAVY) + " it had imported "
          "at exit.")
    failed = [r for r in rows if r.exit_code != 0 or r.probe is None]
    for line in verdicts(rows):
        print(line)
    if failed:
        print(f"error: agents failed: {[(r.profile, r.dp, r.give_back, r.exit_code) for r in failed]}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
