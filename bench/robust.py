"""Robust aggregation: accuracy under Byzantine attacks, and speed against straightforward references.

    python bench/robust.py                 # both tables (about 15 minutes on a busy 2-core machine)
    python bench/robust.py --part speed    # speed only: n = 50 updates of 1M float32
    python bench/robust.py --quick         # a tiny grid and n = 20 x 200k: a minute or two, for CI
    python bench/robust.py --part sites    # (c) only: the rule inside sites, the mean across (about 3 minutes)

(a) Accuracy on digits through the real round engine: a Mosquitto broker started here, the
coordinator and 10 agents (phone profile, mlp_tiny, IID shares of the digits training pool)
on threads of this process; 0, 10, 20 and 30% attackers of each kind x each aggregator in
the registry, FedAvg's plain mean included. The robust rules are configured for the worst
case, f = 3 of 10 (trimmed mean beta = 0.3, Multi-Krum m = n - f = 7, the geometric median
with its default iterations), whatever the actual attackers.
Goal: with 20% sign-flip or scaling attackers, median, trimmed mean and Krum each within 3
points of both its own clean run and the clean run of FedAvg's plain mean.

(b) Speed at n = 50 updates of 1M float32 parameters, every time a median of several runs
taking turns with its reference (see robust_speed.py). Goals: Krum >= 10x faster than a
double loop over pairs; median and trimmed mean no slower than np.median on the stack;
weighted mean within 1.5x of summing the arrays in place, memory not growing with n. The
geometric median is timed against a plain numpy Weiszfeld (no goal).

(c) Sites (robust_sites.py): 3 sites of 5 agents, the first agent of each site attacking (sign flip,
scaling), the median and Krum each run three ways on the same agents: flat at the root (f = 3), inside
each site (f = 1) with the mean across sites, and the plain mean inside sites. Goal: the rule inside
sites under attack within 3 points of its own clean run and of the clean flat run.

BLAS runs on one thread (set OPENBLAS_NUM_THREADS to change it): on a shared machine a
multi-threaded BLAS spins on busy cores and makes the references' timings erratic.
The script exits 0 whatever the results (a MISS is printed, not raised): a benchmark is not
a test.
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # after the thread settings: numpy reads them at import
import platform
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, however this is run

import robust_accuracy
import robust_sites
import robust_speed


def print_verdicts(verdicts: list[tuple[bool, str]]) -> None:
    for ok, text in verdicts:
        print(f"{'PASS' if ok else 'MISS'}  {text}")


def accuracy_part(quick: bool) -> None:
    plan = robust_accuracy.QUICK if quick else robust_accuracy.FULL
    print(f"(a) accuracy on the digits test split after {plan.rounds} rounds: {plan.agents} agents "
          f"({plan.device} profile, IID shares), {plan.local_epochs} local epochs, lr {plan.learning_rate}, "
          f"momentum {plan.momentum}")
    print(f"    robust rules configured for f = {plan.byzantine_f} (trimmed mean beta = {plan.trim_beta}, "
          f"Multi-Krum m = n - f); attacks (the first k agents):")
    print("\n".join(robust_accuracy.describe_attacks(plan)))
    cells = robust_accuracy.run_accuracy(plan)
    print()
    print("\n".join(robust_accuracy.table(plan, cells)))
    print("(accuracy %, of the final global model on the digits test split; clean runs: mean of "
          f"{plan.clean_repeats}; * = some rounds did not complete: failed aggregation or quorum missed)")
    if any(c.admitted != c.attackers for c in cells):
        print("WARNING: the number of agents running an attack differs from the plan in some cells")
    print()
    print_verdicts(robust_accuracy.verdicts(plan, cells))


def sites_part(quick: bool) -> None:
    for rule in ("median",) if quick else ("median", "krum"):
        sites_table(robust_sites.QUICK if quick else replace(robust_sites.FULL, rule=rule))


def sites_table(plan: robust_sites.SitesPlan) -> None:
    print(f"(c) sites: {plan.sites} sites x {plan.agents_per_site} agents ({plan.device} profile, IID shares), "
          f"{plan.rounds} rounds, {plan.rule}; the first agent of every site attacks")
    cells = robust_sites.run(plan)
    print()
    print("\n".join(robust_sites.table(plan, cells)))
    print("(accuracy %, of the final global model on the digits test split; * = some rounds did not complete)")
    print()
    print_verdicts(robust_sites.verdicts(plan, cells))


def speed_part(quick: bool) -> None:
    n, num_params, repetitions = (20, 200_000, 3) if quick else (50, 1_000_000, 5)
    f, beta = 3, 0.2
    print(f"(b) speed: n = {n} updates of {num_params:,} float32 parameters (4 arrays); Krum and Multi-Krum "
          f"with f = {f}, trimmed mean beta = {beta}; medians of {repetitions} runs; BLAS threads "
          f"{os.environ['OPENBLAS_NUM_THREADS']}")
    report = robust_speed.run_speed(n, num_params, repetitions, f, beta)
    print()
    print("\n".join(report.lines))
    print()
    print_verdicts(report.verdicts)
    print()
    print("\n".join(robust_speed.FOOTNOTES))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny grid and sizes, for CI")
    parser.add_argument("--part", choices=("all", "accuracy", "speed", "sites"), default="all")
    args = parser.parse_args(argv)
    print(f"robust aggregation benchmark: python {platform.python_version()}, numpy {np.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs{' (quick)' if args.quick else ''}")
    if args.part in ("all", "speed"):
        print()
        speed_part(args.quick)
    if args.part in ("all", "accuracy"):
        print()
        accuracy_part(args.quick)
    if args.part in ("all", "sites"):
        print()
        sites_part(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
