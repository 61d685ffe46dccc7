"""One configuration of bench/scale.py: a fresh Mosquitto, the real coordinator as its own
process, a light fleet (lightfleet.py), then the raw transport baseline on the same broker (raw_transport.py).

The coordinator is watched from outside, as an operator would: rounds.jsonl in its state
directory (read as it grows), and /proc/<pid> for its peak RSS and CPU time, sampled when each
round's line appears. It is not started with --exit-when-finished, so that /proc still
describes it after the last round. Every wait is bounded: a coordinator that dies or stalls
fails its row with the reason instead of hanging the bench.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from affinity import spawning_on
from lightfleet import LightFleet
from procstat import CORES, cpu_seconds, proc_status, snapshot, used
from raw_transport import replay_raw

from launcher.broker import MosquittoBroker
from launcher.fleet import ManagedProcess, as_flags

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SPLITS = ("collect_s", "aggregate_s", "checkpoint_s", "publish_s")
"""Round-time parts newer coordinators write to rounds.jsonl; printed when present."""
TRANSPORT_BYTES_PER_S = 20e6
"""Pessimistic throughput for deadlines and timeouts: generous on a busy 2-core machine."""


def human(count: int) -> str:
    """127000 -> 127k, 8000000 -> 8M."""
    for size, suffix in ((1_000_000, "M"), (1000, "k")):
        if count >= size and count % (size // 10) == 0:
            return f"{count / size:g}{suffix}"
    return str(count)


@dataclass(frozen=True)
class Config:
    agents: int
    params: int
    aggregator: str

    @property
    def label(self) -> str:
        return f"{self.agents}x{human(self.params)}/{self.aggregator}"

    @property
    def update_bytes(self) -> int:
        return self.params * 4 + 2048

    @property
    def round_budget_s(self) -> float:
        """The coordinator's round deadline: all updates at a pessimistic rate, plus slack."""
        return 60.0 + self.agents * self.update_bytes / TRANSPORT_BYTES_PER_S


RAW_REPLAYS = 3
"""Raw transport replays per row; their median is the baseline."""
SINK_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(128 << 20)}
"""glibc keeps the sink's freed buffers. paho allocates one per receive and per slice of each message; with glibc's
defaults a sink that drops each payload at once hands them back and faults them in again: 691,000 page faults for
2,000 messages of 508 KB, 1.1 to 1.4 CPU ms a message, most of it in the kernel, and a baseline that swung 0.5 to
1.4 s at 1,000 messages. Kept, 9,700 faults and 0.47 ms a message (2026-12-03). The coordinator holds its buffers
longer and does not pay it (6,000 faults over some 8,000 updates), so the untuned sink flattered the ratio."""


@dataclass
class Result:
    config: Config
    pinned: bool = False
    """The coordinator and the sink were started on cores of their own (affinity.py)."""
    coordinator_cores: frozenset[int] | None = None
    """The cores the coordinator process was allowed, as the kernel reported them once it ran."""
    records: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0
    raw_s: float | None = None
    """The median of the raw transport replays (``raw_runs``)."""
    raw_runs: list[float] = field(default_factory=list)
    raw_use: list[dict[str, float]] = field(default_factory=list)
    """Over each raw replay (the first publish to the sink's exit): wall seconds, and the CPU seconds of the whole
    machine, the fleet and the broker (``procstat.used``); the sink and anything else are what the machine adds."""
    peak_rss: int | None = None
    cpu_per_round_s: float | None = None
    round_use: dict[str, float] = field(default_factory=dict)
    """The same counters per timed round, over the span ``cpu_per_round_s`` covers; the coordinator's is that."""
    fleet_started_at: float | None = None
    """time.time() when the light fleet began connecting (the coordinator started just before)."""
    error: str | None = None

    @property
    def timed(self) -> list[dict[str, Any]]:
        """The rounds after the bootstrap (the first), which send deltas."""
        return self.records[1:]

    @property
    def online_s(self) -> float | None:
        """From the fleet's start to round 1's opening: its agents connecting, their statuses admitted, the round
        opened once all were there (rounds.jsonl: ``closed_at`` is when collecting ended, before aggregating, so the
        opening is that less ``collect_s`` and ``publish_s``)."""
        if self.fleet_started_at is None or not self.records:
            return None
        first = self.records[0]
        before = [first.get(name) for name in ("collect_s", "publish_s")]
        if not all(isinstance(v, (int, float)) for v in before):
            return None
        return float(first["closed_at"]) - sum(before) - self.fleet_started_at  # type: ignore[arg-type]

    @property
    def busy(self) -> float | None:
        """The fraction of all cores busy over the timed rounds."""
        return _busy([self.round_use]) if self.round_use else None

    @property
    def raw_busy(self) -> float | None:
        """The fraction of all cores busy over the raw replays."""
        return _busy(self.raw_use) if self.raw_use else None

    @property
    def raw_median_use(self) -> dict[str, float]:
        """Each counter's median over the replays."""
        return {key: statistics.median(u[key] for u in self.raw_use) for key in self.raw_use[0]} if self.raw_use else {}

    @property
    def receiver_busy(self) -> float | None:
        """Pinned: how busy the coordinator kept its cores (its CPU a round over the time from one round's close to
        the next, the spans its CPU was sampled over)."""
        spans = [float(b["closed_at"]) - float(a["closed_at"]) for a, b in pairwise(self.records)]
        if self.cpu_per_round_s is None or not spans or min(spans) <= 0:
            return None
        return self.cpu_per_round_s / statistics.mean(spans)

    @property
    def cpu_ratio(self) -> float | None:
        """The machine's CPU a timed round over its CPU a raw replay (the replays' median)."""
        if not self.round_use or not self.raw_use:
            return None
        return self.round_use["machine"] / self.raw_median_use["machine"]

    def coordinator_budget_s(self, ratio: float) -> float | None:
        """CPU seconds an update the coordinator could spend for a round of ``ratio`` x the raw replay, were the
        cores as busy as in the replays and the rest of the machine's CPU a round (fleet, broker) as measured."""
        raw_busy = self.raw_busy
        if not self.round_use or self.cpu_per_round_s is None or self.raw_s is None or raw_busy is None:
            return None
        rest = self.round_use["machine"] - self.cpu_per_round_s
        return (ratio * self.raw_s * CORES * raw_busy - rest) / self.config.agents

    @property
    def round_s(self) -> float | None:
        return statistics.median(r["duration_s"] for r in self.timed) if self.timed else None

    def split(self, name: str) -> float | None:
        values = [r[name] for r in self.timed if isinstance(r.get(name), (int, float))]
        return statistics.median(values) if values else None

    @property
    def accepted(self) -> int:
        """Updates that counted: answered less rejected (on receipt, or dropped at the close, such as bootstrap
        proposals outside the majority), so a round whose answers were all thrown away does not pass."""
        return sum(int(r["answered"]) - int(r.get("rejected", 0)) for r in self.records)

    @property
    def failed_rounds(self) -> list[str]:
        return [f"round {r['round']} {r['outcome']} ({r.get('reason')})" for r in self.records
                if r["outcome"] != "completed"]


def _busy(uses: list[dict[str, float]]) -> float | None:
    wall = sum(u["wall"] for u in uses)
    return sum(u["machine"] for u in uses) / (wall * CORES) if wall > 0 else None


# -- the coordinator, seen from outside -------------------------------------------------
class RoundsLog:
    """rounds.jsonl, read incrementally as the coordinator appends to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open() as handle:
                handle.seek(self._offset)
                text = handle.read()
                self._offset = handle.tell()
        except FileNotFoundError:
            return []
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        fresh = [json.loads(line) for line in lines if line.strip()]
        self.records += fresh
        return fresh


def start_coordinator(run_dir: Path, url: str, rounds: int, settings: dict[str, Any],
                      cores: frozenset[int] | None = None) -> ManagedProcess:
    state_dir = run_dir / "coordinator"
    merged = {"federation": "scale", "broker_url": url, "state_dir": state_dir, "http_host": "127.0.0.1",
              "http_port": 0, "rounds": rounds, "fraction_fit": 1.0, "agent_timeout_s": 3600.0,
              "evaluate_final": False, "exit_when_finished": False,
              # The light agents do not sign (signing 10,000 updates a round would load the cores the
              # coordinator is measured on); bench/signing.py measures what signatures cost.
              "enrollment": "open", **settings}
    argv = [sys.executable, "-m", "coordinator", "run", *as_flags(merged)]
    process = ManagedProcess("coordinator", argv, state_dir / "coordinator.log", {**os.environ, "PYTHONUNBUFFERED": "1"})
    with spawning_on(cores):
        return process.start()


def watch(coordinator: ManagedProcess, log: RoundsLog, rounds: int, timeout_s: float, poll_s: float,
          on_round: Callable[[dict[str, Any], int], None], max_rss: int | None = None,
          fleet: LightFleet | None = None) -> str | None:
    """Wait for ``rounds`` lines; call ``on_round(record, pid)`` as each appears. The failure, or None.

    ``max_rss``: kill the coordinator above this resident size, before it takes a shared machine down.
    ``fleet``: stop at its first error (it would not answer the round).
    """
    deadline = time.monotonic() + timeout_s
    assert coordinator.pid is not None
    while len(log.records) < rounds:
        for record in log.poll():
            on_round(record, coordinator.pid)
        if len(log.records) >= rounds:
            break
        if not coordinator.running:
            tail = coordinator.log_tail(3).replace("\n", " | ")[-300:]
            return f"coordinator exited with {coordinator.returncode} after {len(log.records)} rounds: {tail}"
        if fleet is not None and fleet.errors:
            return f"the light fleet failed after {len(log.records)} rounds"
        if time.monotonic() > deadline:
            return f"timeout after {timeout_s:.0f}s ({len(log.records)} of {rounds} rounds closed)"
        rss = proc_status(coordinator.pid).get("VmRSS", 0)
        if max_rss is not None and rss > max_rss:
            coordinator.kill()
            return f"killed at RSS {rss / 1e9:.1f} GB > the bench's limit {max_rss / 1e9:.1f} GB ({len(log.records)} rounds closed)"
        time.sleep(poll_s)
    return None


# -- one configuration -------------------------------------------------------------------
def run_config(config: Config, rounds: int, publishers: int = 4, keep: Path | None = None,
               max_rss: int | None = None, receiver: frozenset[int] | None = None) -> Result:
    """``receiver``: the cores the coordinator and the raw replays' sink run on (affinity.py; None: any)."""
    result = Result(config, pinned=receiver is not None)
    run_dir = Path(tempfile.mkdtemp(prefix="fl-scale-"))
    broker = MosquittoBroker(workdir=run_dir / "broker")
    fleet: LightFleet | None = None
    coordinator: ManagedProcess | None = None
    try:
        broker.start()
        settings: dict[str, Any] = {
            "aggregator": config.aggregator, "byzantine_f": 1 if config.aggregator in ("krum", "multi_krum") else 0,
            "min_fit_agents": config.agents, "min_available_agents": config.agents,
            "round_deadline_s": round(config.round_budget_s), "max_update_bytes": max(256 << 20, 2 * config.update_bytes),
            "log_level": "INFO",
        }
        coordinator = start_coordinator(run_dir, broker.url, rounds, settings, receiver)
        assert coordinator.pid is not None
        result.coordinator_cores = frozenset(os.sched_getaffinity(coordinator.pid))
        result.fleet_started_at = time.time()
        fleet = LightFleet(broker.url, "scale", config.agents, config.params, publishers=publishers).start()
        log = RoundsLog(run_dir / "coordinator" / "rounds.jsonl")
        cpu: list[float] = []
        counters: list[dict[str, float]] = []  # the rest of the machine, beside each coordinator sample

        def on_round(record: dict[str, Any], pid: int) -> None:
            seconds = cpu_seconds(pid)
            if seconds is not None:
                cpu.append(seconds)
                counters.append(snapshot(broker.pid))

        # Registration of every agent, then the rounds: each may take up to its deadline.
        timeout = 120.0 + rounds * config.round_budget_s * 1.5
        result.error = watch(coordinator, log, rounds, timeout, 0.1, on_round, max_rss, fleet)
        result.records = log.records
        if coordinator.pid is not None:
            result.peak_rss = proc_status(coordinator.pid).get("VmHWM")
        if len(cpu) >= 2:
            result.cpu_per_round_s = (cpu[-1] - cpu[0]) / (len(cpu) - 1)
            result.round_use = used(counters[0], counters[-1], len(counters) - 1)
        fleet.drain(60.0)
        result.sent = fleet.acked
        if fleet.errors:
            result.error = (result.error or "") + f" fleet: {fleet.errors[0]}"
        coordinator.terminate(30.0)  # its memory back before the baseline
        if result.error is None and fleet.stats.update_sizes:
            last = max(fleet.stats.update_sizes)
            # One replay swung 2x between runs of one row on a quiet machine: the median of a few is the baseline.
            for _ in range(RAW_REPLAYS):
                seconds, use = raw_transport(fleet, last, broker,
                                             timeout_s=config.round_budget_s * 2, cores=receiver)
                result.raw_runs.append(seconds)
                result.raw_use.append(use)
            result.raw_s = statistics.median(result.raw_runs)
    except Exception as exc:  # noqa: BLE001 - a crash fails this row, not the bench
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        _stop_all(fleet, coordinator, broker)
        if keep is not None:
            shutil.copytree(run_dir / "coordinator", keep / config.label.replace("/", "_"), dirs_exist_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def raw_transport(fleet: LightFleet, round_number: int, broker: MosquittoBroker,
                  timeout_s: float, cores: frozenset[int] | None = None) -> tuple[float, dict[str, float]]:
    """The same messages as ``round_number``'s updates, on the same publishers and built the same way (each agent's
    copy of its template), to one subscriber in its own process: what the fleet's sending, the broker and the MQTT
    client cost, with no decoding, validation or aggregation. Until 2026-12-05 it sent one zero-filled buffer again
    and again, which spared the fleet a copy of every update the round paid for (0.9-1.3 CPU s of the fleet a round
    at 10,000 agents, on the cores the coordinator was measured on). Seconds
    from the first publish to the last receipt, and the counters' use from just before the first
    publish to the sink's exit (``procstat.used``). ``cores``: where the sink runs (the coordinator's, when pinned)."""
    total = sum(len(s) for s in fleet.stats.update_sizes[round_number])
    with spawning_on(cores):
        sink = subprocess.Popen([sys.executable, str(HERE / "raw_transport.py"), "sink", broker.url, "bench/raw", str(total)],
                                stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **SINK_MALLOC})
    try:
        assert sink.stdout is not None
        if sink.stdout.readline().strip() != "ready":
            raise RuntimeError("the raw transport sink did not start")
        before = snapshot(broker.pid)
        start = replay_raw(fleet.publishers, fleet.replay_messages(round_number), "bench/raw")
        out, _ = sink.communicate(timeout=timeout_s)
        use = used(before, snapshot(broker.pid))
        _, _first, last, count, _size = out.split()
        if int(count) != total:
            raise RuntimeError(f"the sink got {count} of {total} messages")
        return float(last) - start, use
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()


# -- the long run ------------------------------------------------------------------------
@dataclass
class LongResult:
    rounds: int
    records: list[dict[str, Any]] = field(default_factory=list)
    early: dict[str, float] = field(default_factory=dict)
    """At round ``EARLY_ROUND`` (or the first poll after it): round, rss, checkpoint bytes."""
    late: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def gaps(self, first: int, last: int) -> list[float]:
        """Seconds between the closes of consecutive rounds, for rounds first..last (1-based)."""
        closed = [r["closed_at"] for r in self.records[max(0, first - 2):last]]
        return [b - a for a, b in zip(closed, closed[1:], strict=False)]


EARLY_ROUND = 100


def run_long(rounds: int, agents: int = 6, params: int = 1000) -> LongResult:
    """``agents`` light agents for ``rounds`` back-to-back rounds of a tiny model (mean)."""
    result = LongResult(rounds)
    run_dir = Path(tempfile.mkdtemp(prefix="fl-scale-long-"))
    broker = MosquittoBroker(workdir=run_dir / "broker")
    fleet: LightFleet | None = None
    coordinator: ManagedProcess | None = None
    checkpoint = run_dir / "coordinator" / "checkpoint.msgpack"

    def sample(record: dict[str, Any], pid: int) -> dict[str, float]:
        return {"round": record["round"], "rss": proc_status(pid).get("VmRSS", 0),
                "checkpoint": checkpoint.stat().st_size if checkpoint.exists() else 0}

    def on_round(record: dict[str, Any], pid: int) -> None:
        if not result.early and record["round"] >= min(EARLY_ROUND, rounds):
            result.early = sample(record, pid)

    try:
        broker.start()
        settings = {"aggregator": "mean", "min_fit_agents": agents, "min_available_agents": agents,
                    "round_deadline_s": 60, "log_level": "WARNING"}
        coordinator = start_coordinator(run_dir, broker.url, rounds, settings)
        fleet = LightFleet(broker.url, "scale", agents, params, publishers=1).start()
        log = RoundsLog(run_dir / "coordinator" / "rounds.jsonl")
        result.error = watch(coordinator, log, rounds, 120.0 + rounds * 2.0, 0.02, on_round, fleet=fleet)
        result.records = log.records
        if log.records and coordinator.pid is not None:
            result.late = sample(log.records[-1], coordinator.pid)
        if fleet.errors:
            result.error = (result.error or "") + f" fleet: {fleet.errors[0]}"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        _stop_all(fleet, coordinator, broker)
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _stop_all(fleet: LightFleet | None, coordinator: ManagedProcess | None, broker: MosquittoBroker) -> None:
    """Fleet, coordinator, broker: in that order, whatever state a row ended in."""
    if fleet is not None:
        fleet.stop()
    if coordinator is not None:
        coordinator.terminate(30.0)
    broker.stop()
