"""What the benches read of processes and of the machine in /proc: CPU seconds and resident sizes, seen from outside
as an operator would."""

from __future__ import annotations

import os
import time
from pathlib import Path


def proc_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS... of /proc/<pid>/status, in bytes (empty once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        name, _, value = line.partition(":")
        if name.startswith("Vm") and value.strip().endswith("kB"):
            out[name] = int(value.split()[0]) * 1024
    return out


CORES = os.cpu_count() or 1


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot: /proc/stat's total less idle and iowait."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def snapshot(broker_pid: int | None) -> dict[str, float]:
    """Counters read at one instant: wall (monotonic) seconds, and the CPU seconds so far of the whole machine, of
    the fleet (this process: its publishers and the bench's polling) and of the broker."""
    return {"wall": time.monotonic(), "machine": machine_busy_s(), "fleet": time.process_time(),
            "broker": (cpu_seconds(broker_pid) if broker_pid else None) or 0.0}


def used(before: dict[str, float], after: dict[str, float], spans: int = 1) -> dict[str, float]:
    """What each counter of two snapshots moved, per span between them."""
    return {key: (after[key] - before[key]) / spans for key in before}


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
