"""bench/secagg.py --mqtt: a secure and a plain FedAvg round on the same fleet, over a real broker.

Each row starts a fresh Mosquitto, the coordinator as its own process (``python -m coordinator run``,
via scale_run.py) and a light fleet in this process (secagg_fleet.py: the real SecAgg+ code per agent,
a few MQTT connections). Round 1 bootstraps in the clear; round 2 trains and is measured: plain (the
mean of float32 deltas), secure (SecAgg+, the finest grid in a ring of 2^32) and secure int8 (int8's
grid, each masked element in ring_bits bits). Same agents, same deltas, same dropouts in every mode.

Columns: the round's wall time (rounds.jsonl ``duration_s``) and its ratio to the plain round's;
CPU seconds per agent (its stages' work, encoding included; plain: encoding its update) and bytes
it sent; the coordinator's CPU over the round (/proc, between the closes of rounds 1 and 2) and its
peak RSS (VmHWM); the largest |applied mean - the float64 mean of the survivors' deltas| (from the
global states before and after the round) against the grid's step, and the largest difference
from the plain run's applied mean. 10% dropouts: agents vanish after advertising, after sharing
and after masking in turn (in the plain round, the first two send nothing); a round with a silent
agent runs to its deadline (plain and secure alike), so those rows time the deadline, not the work.
Exits 1 if a round fails or a mean is off by more than its bound; timings never fail it.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from procstat import cpu_seconds, proc_status
from scale_run import RoundsLog, start_coordinator, watch
from secagg_fleet import SCALE, SecureLightFleet, plain_mean

from launcher.broker import MosquittoBroker
from launcher.fleet import ManagedProcess
from protocol.secagg.ring import GRID_LEVELS

MODES = ("plain", "secure", "secure int8")
CLIP = 20 * SCALE  # the deltas are N(0, SCALE): nothing is clipped in practice
STAGES = ("advertise", "share", "mask")


@dataclass
class Row:
    agents: int
    params: int
    rate: float
    mode: str
    round_s: float | None = None
    agent_cpu_s: float | None = None
    agent_bytes: float | None = None
    coord_cpu_s: float | None = None
    peak_rss: int | None = None
    error_vs_exact: float | None = None
    bound: float | None = None
    error_vs_plain: float | None = None
    applied: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    failure: str | None = None
    recovered: str = ""
    fleet_cpu_s: float | None = None
    """All agents' CPU for the round, in series on the fleet's one thread (part of the round's wall time)."""
    stages: str = ""


def drops_for(ids: list[str], rate: float) -> dict[str, str]:
    gone = ids[1:: max(1, round(1 / rate))][: round(rate * len(ids))] if rate else []
    order = ("share", "advertise", "mask")  # after sharing first: the costly recovery (pairwise masks)
    return {agent: order[i % 3] for i, agent in enumerate(gone)}


def deadlines(agents: int, params: int) -> tuple[float, float]:
    """(round deadline, secagg stage seconds): room for the fleet's work in series on a busy machine."""
    work = 1.0 + agents * params * 5e-7  # ~60 ms per agent at 127k: keys, masks, encoding, the broker
    stage = max(2.0, math.ceil(work))
    return max(2 * stage + 2 * work, 6.0), stage


def run_row(agents: int, params: int, rate: float, mode: str, degree: int = 0, threshold: int = 0,
            prg: str = "chacha20") -> Row:
    """``degree``, ``threshold``, ``prg``: secagg_degree, secagg_threshold (0: the coordinator's defaults), secagg_prg."""
    row = Row(agents, params, rate, mode)
    run_dir = Path(tempfile.mkdtemp(prefix="fl-secagg-"))
    broker = MosquittoBroker(workdir=run_dir / "broker")
    fleet: SecureLightFleet | None = None
    coordinator: ManagedProcess | None = None
    deadline, stage = deadlines(agents, params)
    try:
        broker.start()
        survivors_needed = agents - round(rate * agents)
        settings: dict[str, Any] = {
            "secure_aggregation": mode != "plain", "compression": "int8" if mode.endswith("int8") else "none",
            "min_fit_agents": max(2, survivors_needed - 1), "min_available_agents": agents,
            "round_deadline_s": deadline, "secagg_stage_s": stage, "secagg_clip": CLIP, "max_norm_ratio": 0,
            "claim_cap_multiple": 0, "log_level": "INFO", "momentum": 0.0, "secagg_degree": degree,
            "secagg_threshold": threshold, "secagg_prg": prg,
        }
        coordinator = start_coordinator(run_dir, broker.url, 2, settings)
        ids = [f"sim-{i:05d}" for i in range(agents)]
        fleet = SecureLightFleet(broker.url, "scale", agents, params, drops_for(ids, rate)).start()
        log = RoundsLog(run_dir / "coordinator" / "rounds.jsonl")
        cpu: list[float] = []

        def on_round(record: dict[str, Any], pid: int) -> None:
            seconds = cpu_seconds(pid)
            if seconds is not None:
                cpu.append(seconds)

        row.failure = watch(coordinator, log, 2, 120.0 + 3 * deadline, 0.05, on_round, 4 << 30, fleet)
        if coordinator.pid is not None:
            row.peak_rss = proc_status(coordinator.pid).get("VmHWM")
        if row.failure is None:
            record = log.records[-1]
            if record.get("outcome") != "completed":
                row.failure = f"round 2 {record.get('outcome')}: {record.get('detail') or record.get('secure')}"
            else:
                measure(row, fleet, record, cpu)
    except Exception as exc:  # noqa: BLE001 - a crash fails this row, not the bench
        row.failure = f"{type(exc).__name__}: {exc}"
    finally:
        if fleet is not None:
            fleet.stop()
        if coordinator is not None:
            coordinator.terminate(30.0)
        broker.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return row


def measure(row: Row, fleet: SecureLightFleet, record: dict[str, Any], cpu: list[float]) -> None:
    row.round_s = float(record["duration_s"])
    row.coord_cpu_s = cpu[-1] - cpu[0] if len(cpu) >= 2 else None
    senders = [a for a in fleet.ids if a in fleet.bytes_up and a not in fleet.drops]  # agents that stayed
    row.agent_bytes = float(np.mean([fleet.bytes_up[a] for a in senders]))
    if row.mode == "plain":  # every agent encodes one update: the template encodings' mean
        row.agent_cpu_s = float(np.mean([v for k, v in fleet.cpu_s.items() if k.startswith("variant-")]))
        row.fleet_cpu_s = row.agent_cpu_s * row.agents
    else:
        row.agent_cpu_s = float(np.mean([fleet.cpu_s[a] for a in senders]))
        row.fleet_cpu_s = sum(fleet.cpu_s.values())
    secure = record.get("secure") or {}
    row.stages = "/".join(f"{(secure.get('stages') or {}).get(s, {}).get('seconds', 0):.2f}"
                          for s in ("advertise", "share", "mask", "unmask")) if secure else ""
    family = (secure.get("families") or {}).get(fleet.family, {})
    survivors = family.get("survivors") or [a for a in fleet.ids if fleet.drops.get(a) in (None, "mask")]
    recovered = family.get("recovered") or {}
    row.recovered = "/".join(str(len(recovered.get(k, []))) for k in ("pairwise_masks", "self_masks")) if family else ""
    # The states fleet.kept holds for rounds 2 and 3: the round applied the difference (server lr 1).
    waited = time.monotonic() + 10.0
    while not {2, 3} <= set(fleet.kept) and time.monotonic() < waited:  # the new state may still be on its way
        time.sleep(0.05)
    before, after = fleet.kept.get(2), fleet.kept.get(3)
    if before is None or after is None:
        row.failure = "the global states of rounds 2 and 3 were not both heard"
        return
    row.applied = {n: after.weights[n].astype(np.float64) - before.weights[n] for n in fleet.layout}
    exact = plain_mean(fleet, 2, sorted(survivors))
    row.error_vs_exact = max(float(np.max(np.abs(row.applied[n] - exact[n]))) for n in exact)
    n = len(survivors)
    if row.mode == "plain":
        row.bound = 1e-6  # float32 sums and the float32 state
    else:  # per value: each agent off by a step (stochastic) or half (nearest), and the weight sum as much
        levels = GRID_LEVELS["int8"] if row.mode.endswith("int8") else ((1 << 31) - 1) // n
        row.bound = 2 * CLIP / levels + 1e-6


def compare(rows: list[Row]) -> None:
    """Each secure row's largest difference from its plain row's applied mean."""
    plain = {(r.agents, r.params, r.rate): r for r in rows if r.mode == "plain" and r.applied}
    for row in rows:
        base = plain.get((row.agents, row.params, row.rate))
        if base is not None and row.applied and row.mode != "plain":
            row.error_vs_plain = max(float(np.max(np.abs(row.applied[n] - base.applied[n]))) for n in base.applied)


GOAL_RATIO_AT_100 = 2.0
"""Issue 25: at 100 agents a secure round costs at most this many plain rounds."""


def plain_rows(rows: list[Row]) -> dict[tuple[int, int, float], Row]:
    """The plain rows that ran, by (agents, params, rate): each secure row's baseline."""
    return {(r.agents, r.params, r.rate): r for r in rows if r.mode == "plain" and not r.failure}


def goals(rows: list[Row]) -> list[str]:
    """Issue 25's goals this run's rows can judge (a goal whose rows did not run is not printed)."""
    plain = plain_rows(rows)
    out = []
    for r in rows:
        base = plain.get((r.agents, r.params, r.rate))
        if r.agents == 100 and r.rate == 0 and r.mode == "secure" and base and r.round_s and base.round_s:
            ratio = r.round_s / base.round_s
            out.append(f"{'PASS' if ratio <= GOAL_RATIO_AT_100 else 'MISS'} a secure round at 100 agents costs at most "
                       f"{GOAL_RATIO_AT_100:g}x a plain one: {ratio:.2f}x ({r.round_s:.2f} s against {base.round_s:.2f} s; "
                       "the light fleet's agents work in series here)")
        if r.mode == "secure int8" and base and r.agent_bytes and base.agent_bytes:
            out.append(f"{'PASS' if r.agent_bytes < base.agent_bytes else 'MISS'} with int8 an agent uploads less than "
                       f"in a plain round ({r.agents} agents, {r.rate:.0%}): {r.agent_bytes / 1e3:.1f} KB against "
                       f"{base.agent_bytes / 1e3:.1f} KB, every stage's messages")
    at_500 = [r for r in rows if r.agents == 500]
    if at_500:
        failed = [f"{r.mode} {r.rate:.0%}" for r in at_500 if r.failure]
        out.append(f"{'MISS' if failed else 'PASS'} 500 agents complete every mode"
                   + (f" (failed: {', '.join(failed)})" if failed else ""))
    return out


def table(rows: list[Row]) -> list[str]:
    plain = {key: r.round_s for key, r in plain_rows(rows).items()}
    out = ["| agents x params | dropouts | mode | round s | vs plain | stages s adv/share/mask/unmask "
           "| fleet CPU s (serial) | CPU ms/agent | KB up/agent | coordinator CPU s "
           "| coordinator peak RSS MB | recovered pairwise/self | max err vs exact mean | bound | max diff vs plain |",
           "|" + "---|" * 15]
    for r in rows:
        base = plain.get((r.agents, r.params, r.rate))
        if r.failure:
            out.append(f"| {r.agents} x {r.params:,} | {r.rate:.0%} | {r.mode} | FAILED: {r.failure[:160]} |")
            continue
        ratio = f"{r.round_s / base:.2f}x" if base and r.round_s else "-"
        out.append(
            f"| {r.agents} x {r.params:,} | {r.rate:.0%} | {r.mode} | {r.round_s:.2f} | {ratio} | {r.stages or '-'} "
            f"| {r.fleet_cpu_s or 0:.2f} | {1e3 * (r.agent_cpu_s or 0):.1f} | {(r.agent_bytes or 0) / 1e3:.1f} | {r.coord_cpu_s or 0:.2f} "
            f"| {(r.peak_rss or 0) / 1e6:.0f} | {r.recovered or '-'} | {r.error_vs_exact:.2e} | {r.bound:.2e} "
            f"| {'-' if r.error_vs_plain is None else f'{r.error_vs_plain:.2e}'} |")
    return out


def ok(row: Row) -> bool:
    return row.failure is None and row.error_vs_exact is not None and row.bound is not None \
        and row.error_vs_exact <= row.bound


def run(fleets: list[tuple[int, int]], rates: tuple[float, ...], degree: int = 0, threshold: int = 0,
        prg: str = "chacha20") -> int:
    rows = []
    print(f"# secagg_degree {degree or 'default'}, secagg_threshold {threshold or 'default'}, secagg_prg {prg}")
    for agents, params in fleets:
        for rate in rates:
            for mode in MODES:
                rows.append(run_row(agents, params, rate, mode, degree, threshold, prg))
                print(f"# done: {agents} x {params:,}, {rate:.0%}, {mode}: "
                      f"{rows[-1].failure or f'{rows[-1].round_s:.2f} s'}", flush=True)
    compare(rows)
    print()
    print("\n".join(table(rows)))
    failed = [r for r in rows if not ok(r)]
    print()
    print("round s: rounds.jsonl duration_s of the train round (the fleet's agents work in series in one process; "
          "a row with dropouts runs to the deadline). CPU/agent: secure = its four stages and encodings, plain = "
          "encoding its update. recovered: pairwise masks of agents that shared but did not upload / self-masks "
          "rebuilt from neighbours' shares (survivors whose own reveal the unmasking did not wait for, dropouts or "
          "not). bound: 2 grid steps (plain: 1e-6).")
    print(f"{'PASS' if not failed else 'FAIL'} every round completed and every applied mean is within its bound"
          + (f" (failed: {', '.join(f'{r.agents}/{r.rate:.0%}/{r.mode}' for r in failed)})" if failed else ""))
    print("\n".join(goals(rows)))
    return 1 if failed else 0
