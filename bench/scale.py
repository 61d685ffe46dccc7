"""Nothing lost at scale: the real coordinator against thousands of light agents, and a long run.

    python bench/scale.py                        # the grid below, then the long run (see --long)
    python bench/scale.py --quick                # 50 and 300 agents, mean and krum; 200 long rounds: CI
    python bench/scale.py --configs '1000x*'     # a subset of the grid (shell patterns on the labels)
    python bench/scale.py --part long --long 10000   # the issue's 10,000 rounds (about 2 minutes here)
    python bench/scale.py --pin --configs '*/mean'   # the coordinator on a core of its own (below)

Grid: 100, 1,000, 4,000 and 10,000 agents with a 127k-parameter model, and 100 agents at 1M
and 8M parameters, each with the mean, the coordinate-wise median and Krum (f = 1). Each row
starts a fresh Mosquitto (no queue caps), the coordinator as its own process (``python -m
coordinator run``, fraction 1.0, every agent needed to start, a deadline sized to the load,
no final evaluation round) and the light fleet of lightfleet.py in this process: a few MQTT
connections carry every agent's status and update. Round 1 bootstraps (weights); the rounds
after it send deltas and are the ones timed.

Columns: median round time of the delta rounds (``duration_s`` in the coordinator's
rounds.jsonl, with its parts when the coordinator writes them); online s: from the fleet's start
to round 1's opening (every agent connected, its status admitted, the round opened once all were
there; 1.3-1.6 s at 4,000 agents, 2026-12-05, when the coordinator had stopped looking at every
status after every message: its log put round 1 22.6 s after its start before, 1.0 s after); the
raw transport time of
the last round's updates, built again as the round built them and sent on the same publishers to
one subscriber process (the coordinator's MQTT client, nothing decoded), measured on
the same broker right after (the median of three replays; their spread is printed below the
table); their ratio; how busy all the machine's cores were (/proc/stat) over the timed rounds and
over the replays, and the machine's CPU a round against a replay's ("CPU x": where both keep the
cores busy, the round can be no faster than that ratio allows, and a note under the table says
what the coordinator could spend an update for the ratio goal, and each part's CPU a round and a
replay: coordinator, fleet, broker, and the sink); the coordinator's peak RSS (VmHWM) and CPU seconds
per round (/proc, from the first round's close to the last's); updates it accepted (sum of
``answered`` less ``rejected``) against those the broker acknowledged to the fleet.

Long run: 6 agents, a 1,000-parameter model, rounds back to back (2,000 by default: a round
every 10-16 ms here since Nagle's algorithm is off on every connection, ~0.1 s before; about 25 s
in all, 2026-12-03); the time between rounds, the coordinator's RSS and
its checkpoint's size at round 100 against the last round.

All on one machine: the fleet, the broker and the coordinator share its cores, so round times
include the fleet's work too (kept small: payloads are built once per round, see
lightfleet.py). ``--pin`` separates them as a deployment does (affinity.py): the coordinator
and, in the replays, the sink on the last core, the fleet and the broker on the others; the
ratio then asks whether the coordinator keeps up with what the senders' cores deliver, and the
note under the table says how busy it kept its core. The script exits 0 whatever the results (a MISS is printed, not raised); a
row whose coordinator crashed, stalled or outgrew --max-rss-gb is reported as failed.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from affinity import split
from procstat import CORES
from scale_run import EARLY_ROUND, RAW_REPLAYS, SPLITS, Config, LongResult, Result, human, run_config, run_long

AGGREGATORS = ("mean", "median", "krum")
FULL = [Config(n, p, a) for n, p in ((100, 127_000), (100, 1_000_000), (100, 8_000_000), (1000, 127_000),
                                     (4000, 127_000), (10_000, 127_000)) for a in AGGREGATORS]
QUICK = [Config(n, 127_000, a) for n in (50, 300) for a in ("mean", "krum")]
LONG_ROUNDS, QUICK_LONG_ROUNDS = 2000, 200
RSS_GOAL = 500e6  # bytes, coordinator at 10,000 agents x 127k with the mean
RATIO_GOAL = 1.3  # mean round time / raw transport time, from RATIO_FROM agents up
RATIO_FROM = 300
KRUM_GOAL_S = 2.0  # krum round time at 1,000 x 127k
FLAT = 1.10  # long run: last round within 10% of round 100


def fmt(value: float | None, spec: str) -> str:
    """``format(value, spec)``, or a dash as wide as the spec's width when there is no value."""
    return "-".rjust(int(spec.split(".")[0] or 0)) if value is None else format(value, spec)


def table(results: list[Result]) -> list[str]:
    splits = [s for s in SPLITS if any(r.split(s) is not None for r in results)]
    head = (f"{'agents':>6} {'params':>6} {'aggregator':<10} {'round s':>8} "
            + "".join(f"{s.removesuffix('_s') + ' s':>13}" for s in splits)
            + f" {'online s':>9} {'raw s':>8} {'ratio':>6} {'busy':>5} {'raw busy':>8} {'CPU x':>6} {'RSS MB':>7} "
            f"{'CPU s/rd':>8} {'accepted/sent':>14}  status")
    lines = [head, "-" * len(head)]
    for r in results:
        c = r.config
        ratio = r.round_s / r.raw_s if r.round_s and r.raw_s else None
        status = r.error or ("; ".join(r.failed_rounds) if r.failed_rounds else "ok")
        lines.append(f"{c.agents:>6} {human(c.params):>6} {c.aggregator:<10} {fmt(r.round_s, '8.3f')} "
                     + "".join(f"{fmt(r.split(s), '13.3f')}" for s in splits)
                     + f" {fmt(r.online_s, '9.2f')} {fmt(r.raw_s, '8.3f')} {fmt(ratio, '6.2f')} "
                     f"{fmt(r.busy and 100 * r.busy, '4.0f')}% {fmt(r.raw_busy and 100 * r.raw_busy, '7.0f')}% "
                     f"{fmt(r.cpu_ratio, '6.2f')} "
                     f"{fmt(r.peak_rss / 1e6 if r.peak_rss else None, '7.0f')} {fmt(r.cpu_per_round_s, '8.2f')} "
                     f"{f'{r.accepted}/{r.sent}':>14}  {status}")
    return lines


def cpu_bound_notes(results: list[Result]) -> list[str]:
    """For each mean row held to the ratio goal: how busy the cores were, and what the coordinator could spend
    an update for the goal. On saturated cores a round is no faster than its CPU over the cores."""
    lines = []
    for r in results:
        if r.config.aggregator != "mean" or r.config.agents < RATIO_FROM or r.cpu_per_round_s is None:
            continue
        if r.pinned:  # the shared-core budget below does not apply: the coordinator's core is its own
            seen = ",".join(str(c) for c in sorted(r.coordinator_cores or ()))
            lines.append(f"{r.config.label} (pinned): the coordinator (allowed core {seen}) kept its core "
                         f"{fmt(r.receiver_busy and 100 * r.receiver_busy, '.0f')}% busy, "
                         f"{r.cpu_per_round_s / r.config.agents * 1e3:.2f} CPU ms an update; for {RATIO_GOAL}x it has "
                         f"{fmt(r.raw_s and RATIO_GOAL * r.raw_s / r.config.agents * 1e3, '.2f')} ms of its core's time "
                         "an update")
            continue
        budget = r.coordinator_budget_s(RATIO_GOAL)
        lines.append(f"{r.config.label}: {fmt(r.busy and 100 * r.busy, '.0f')}% of {CORES} cores busy over the "
                     f"rounds, {fmt(r.raw_busy and 100 * r.raw_busy, '.0f')}% over the replays; the machine's CPU a "
                     f"round {fmt(r.cpu_ratio, '.2f')}x a replay's. For {RATIO_GOAL}x the coordinator could spend "
                     f"{fmt(budget and budget * 1e3, '.2f')} CPU ms an update; it spent "
                     f"{r.cpu_per_round_s / r.config.agents * 1e3:.2f}"
                     + (" (below zero: the rest of the machine alone spends more than that a round)"
                        if budget is not None and budget < 0 else ""))
        if r.round_use and r.raw_use:
            rnd, raw = r.round_use, r.raw_median_use
            lines.append(f"  CPU s a round: coordinator {r.cpu_per_round_s:.2f}, fleet {rnd['fleet']:.2f}, broker "
                         f"{rnd['broker']:.2f}, the rest {rnd['machine'] - r.cpu_per_round_s - rnd['fleet'] - rnd['broker']:.2f}"
                         f"; a replay: sink and the rest {raw['machine'] - raw['fleet'] - raw['broker']:.2f}, fleet "
                         f"{raw['fleet']:.2f}, broker {raw['broker']:.2f}")
    return lines


def grid_verdicts(results: list[Result]) -> list[tuple[str, str]]:
    """(PASS | MISS | SKIP, text) for each of the issue's goals; SKIP when its rows were not run."""
    out = []
    broken = [r.config.label for r in results if r.error or r.accepted != r.sent]
    out.append(("MISS" if broken else "PASS",
                f"0 lost updates (accepted == sent) in all {len(results)} rows"
                + (f"; not so (or failed) in {', '.join(broken)}" if broken else "")))
    big = [r for r in results if (r.config.agents, r.config.params, r.config.aggregator) == (10_000, 127_000, "mean")]
    if big:
        rss = big[0].peak_rss
        out.append(("PASS" if rss is not None and rss <= RSS_GOAL and not big[0].error else "MISS",
                    f"coordinator peak RSS <= {RSS_GOAL / 1e6:.0f} MB at 10,000 agents x 127k (mean): "
                    f"{fmt(rss / 1e6 if rss else None, '.0f')} MB{' (row failed)' if big[0].error else ''}"))
    else:
        out.append(("SKIP", "coordinator RSS at 10,000 agents x 127k (mean): row not run"))
    means = [r for r in results if r.config.aggregator == "mean" and r.config.agents >= RATIO_FROM]
    if means:
        ratios = {r.config.label: (r.round_s / r.raw_s if r.round_s and r.raw_s and not r.error else None)
                  for r in means}
        ok = all(v is not None and v <= RATIO_GOAL for v in ratios.values())
        shown = ", ".join(f"{k} {fmt(v, '.2f')}" for k, v in ratios.items())
        pinned = " (the coordinator and the sink on a core of their own: --pin)" if means[0].pinned else ""
        out.append(("PASS" if ok else "MISS",
                    f"mean round time <= {RATIO_GOAL}x raw transport from {RATIO_FROM} agents up{pinned}: {shown}"))
    else:
        out.append(("SKIP", f"mean round time vs raw transport from {RATIO_FROM} agents up: no such row run"))
    krum = [r for r in results if (r.config.agents, r.config.params, r.config.aggregator) == (1000, 127_000, "krum")]
    if krum:
        seconds = krum[0].round_s
        out.append(("PASS" if seconds is not None and seconds < KRUM_GOAL_S and not krum[0].error else "MISS",
                    f"krum at 1,000 agents x 127k under {KRUM_GOAL_S:.0f} s per round: {fmt(seconds, '.3f')} s"))
    else:
        out.append(("SKIP", "krum at 1,000 agents x 127k: row not run"))
    return out


def long_report(result: LongResult) -> tuple[list[str], list[tuple[str, str]]]:
    n = len(result.records)
    lines = [f"long run: {n} of {result.rounds} rounds closed"
             + (f"; FAILED: {result.error}" if result.error else "")]
    if n < 2 or not result.early or not result.late:
        return lines, [("MISS", "long run flat within 10%: the run did not get far enough")]
    early_gaps = result.gaps(2, min(EARLY_ROUND, n))
    late_gaps = result.gaps(max(2, n - 99), n)
    early_gap, late_gap = statistics.median(early_gaps), statistics.median(late_gaps)
    e, late = result.early, result.late
    lines += [
        f"{'':<34} {'round ' + str(int(e['round'])):>14} {'round ' + str(int(late['round'])):>14} {'last/early':>10}",
        f"{'median time between rounds (ms)':<34} {early_gap * 1e3:>14.1f} {late_gap * 1e3:>14.1f} "
        f"{late_gap / early_gap:>10.2f}",
        f"{'coordinator RSS (MB)':<34} {e['rss'] / 1e6:>14.1f} {late['rss'] / 1e6:>14.1f} {late['rss'] / e['rss']:>10.2f}",
        f"{'checkpoint.msgpack (kB)':<34} {e['checkpoint'] / 1e3:>14.1f} {late['checkpoint'] / 1e3:>14.1f} "
        f"{late['checkpoint'] / max(1, e['checkpoint']):>10.2f}",
        f"(time between rounds: medians over rounds 2-{min(EARLY_ROUND, n)} and the last {len(late_gaps)}; "
        f"p95 late {sorted(late_gaps)[int(0.95 * (len(late_gaps) - 1))] * 1e3:.1f} ms)",
    ]
    ok = not result.error
    verdicts = [
        ("PASS" if ok and late_gap <= FLAT * early_gap else "MISS",
         f"time between rounds flat within 10% (round {int(late['round'])} vs {int(e['round'])}): "
         f"{late_gap / early_gap:.2f}x"),
        ("PASS" if ok and late["rss"] <= FLAT * e["rss"] else "MISS",
         f"coordinator RSS flat within 10%: {late['rss'] / e['rss']:.2f}x"),
        ("PASS" if ok and late["checkpoint"] <= FLAT * e["checkpoint"] else "MISS",
         f"checkpoint size flat within 10%: {late['checkpoint'] / max(1, e['checkpoint']):.2f}x"),
    ]
    return lines, verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid and a short long run, for CI")
    parser.add_argument("--part", choices=("all", "grid", "long"), default="all")
    parser.add_argument("--configs", default="", help="comma-separated patterns on labels like 1000x127k/krum")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per grid row, the first bootstrapping")
    parser.add_argument("--long", type=int, default=None, metavar="N",
                        help=f"rounds of the long run (default {LONG_ROUNDS}, quick {QUICK_LONG_ROUNDS})")
    parser.add_argument("--publishers", type=int, default=4, help="MQTT connections the fleet publishes on")
    parser.add_argument("--max-rss-gb", type=float, default=12.0, help="kill a coordinator above this RSS")
    parser.add_argument("--keep", type=Path, default=None, help="copy each row's coordinator state dir here")
    parser.add_argument("--pin", action="store_true", help=(
        "the coordinator (and the raw replays' sink) on a core of its own, the fleet and the broker on the others, "
        "as deployed; default: all share every core"))
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the first round bootstraps and is not timed")
    configs = QUICK if args.quick else FULL
    if args.configs:
        patterns = [p.strip() for p in args.configs.split(",") if p.strip()]
        configs = [c for c in FULL + QUICK if any(fnmatch.fnmatch(c.label, p) for p in patterns)]
        configs = list(dict.fromkeys(configs))
        if not configs:
            parser.error(f"no configuration matches {args.configs!r}; labels look like {FULL[0].label}")
    try:  # before any thread or process starts: they inherit it
        cores = split() if args.pin else None
    except ValueError as exc:
        parser.error(f"--pin: {exc}")
    print(f"scale benchmark: python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs"
          f"{' (quick)' if args.quick else ''}{f'; pinned: {cores.describe()}' if cores else ''}")
    verdicts: list[tuple[str, str]] = []
    if args.part in ("all", "grid"):
        print(f"\ngrid: {len(configs)} rows, {args.rounds} rounds each (round 1 bootstraps; the rest are timed), "
              f"{args.publishers} publisher connections; no final evaluation round")
        results = []
        for config in configs:
            started = time.monotonic()
            result = run_config(config, args.rounds, args.publishers, args.keep, int(args.max_rss_gb * 1e9),
                                cores.receiver if cores else None)
            results.append(result)
            # The row at once as well: a grid stopped midway still shows what it measured.
            print(f"  {config.label}: {time.monotonic() - started:.0f}s | {table([result])[-1].strip()}", flush=True)
        print()
        print("\n".join(table(results)))
        spreads = [f"{r.config.label} {min(r.raw_runs):.3f}-{max(r.raw_runs):.3f}" for r in results if r.raw_runs]
        if spreads:
            print(f"raw transport, {RAW_REPLAYS} replays a row (the median is the baseline), min-max s: {', '.join(spreads)}")
        print("\n".join(cpu_bound_notes(results)))
        verdicts += grid_verdicts(results)
    if args.part in ("all", "long"):
        rounds = args.long or (QUICK_LONG_ROUNDS if args.quick else LONG_ROUNDS)
        print(f"\nlong run: 6 agents, 1,000 parameters, mean, {rounds} rounds back to back", flush=True)
        lines, long_verdicts = long_report(run_long(rounds))
        print("\n".join(lines))
        verdicts += long_verdicts
    print()
    for verdict, text in verdicts:
        print(f"{verdict}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
