"""Round policies on slow, uneven fleets: synchronous FedAvg, with over-selection, and FedBuff.

    python bench/async.py            # the full table (about 10 minutes on 2 cores)
    python bench/async.py --quick    # a smoke run for CI: 6 agents, short delays (numbers meaningless)
    python bench/async.py --only weighting --seed 1   # part 2 alone (about 2 minutes), another split
    python bench/async.py --only weighting --unbounded --temperature 2   # part 2 without the default bounds

Part 1 (bench/async_rounds.py): wall-clock time to a target accuracy and the accuracy after a
fixed wall-clock budget, for the three policies, in one run on the same fleet, data and seeds.
The goal: FedBuff reaches the target at least 2x sooner than synchronous FedAvg, with a final
accuracy within 1 point of it.

Part 2 (bench/async_weighting.py): on a Dirichlet(0.1) split, where several agents hold one or
two classes, ``--weighting kl`` (exp(-KL/T), floored for a class's sole holders) against plain
sample-count weighting: accuracy, the spread of per-class accuracy and the worst class; a class under
5% is flagged. The goals: kl's accuracy and its worst class at least sample weighting's.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from async_rounds import FleetPlan, Mode, render, run_mode
from async_weighting import SkewPlan, run_weighting, skew_goals
from async_weighting import render as render_skew

from launcher.broker import MosquittoBroker

FULL = FleetPlan(agents=12, family="cnn_small", partition="iid", alpha=1.0, straggler_delay="profile", local_epochs=2,
                 learning_rate=0.05, batch_size=16, budget_s=60.0, target=0.90)
SKEW_FULL = SkewPlan(agents=12, alpha=0.1, rounds=30, family="cnn_small", local_epochs=2, learning_rate=0.05,
                     temperature=1.0)
SKEW_QUICK = SkewPlan(agents=6, alpha=0.1, rounds=2, family="mlp_tiny", local_epochs=1, learning_rate=0.05,
                      temperature=1.0)
QUICK = FleetPlan(agents=6, family="mlp_tiny", partition="iid", alpha=1.0, straggler_delay="lognormal:0.05,0.5",
                  local_epochs=1, learning_rate=0.05, batch_size=16, budget_s=5.0, target=0.5)


def modes(plan: FleetPlan, quick: bool) -> list[Mode]:
    rounds = 2 if quick else 12
    wanted = round(plan.agents * 2 / 3)
    buffer = plan.agents // 2
    return [
        Mode("sync FedAvg (deadline 30s, quorum 50%)", rounds,
             {"round_deadline_s": 30.0, "quorum_fraction": 0.5, "fraction_fit": 1.0}),
        Mode(f"sync, over-selection ({wanted} of {plan.agents})", rounds,
             {"round_deadline_s": 30.0, "quorum_fraction": 0.5, "fraction_fit": wanted / plan.agents,
              "over_selection": plan.agents / wanted - 1.0}),
        Mode(f"FedBuff (K={buffer}, max staleness 4)", 3 * rounds,
             {"mode": "async", "buffer_size": buffer, "max_staleness": 4, "round_deadline_s": 30.0,
              "quorum_fraction": 0.5}),
    ]


def goals(plan: FleetPlan, rows: list[tuple[Mode, object]]) -> list[tuple[bool, str]]:
    sync, fedbuff = rows[0][1], rows[-1][1]
    t_sync, t_buff = sync.time_to(plan.target), fedbuff.time_to(plan.target)  # type: ignore[attr-defined]
    speedup = (t_sync / t_buff) if t_sync and t_buff else None
    gap = (fedbuff.final - sync.final) * 100  # type: ignore[attr-defined]
    return [
        (speedup is not None and speedup >= 2.0,
         f"FedBuff reaches {plan.target:.0%} at least 2x sooner than synchronous FedAvg: "
         f"{'never' if t_buff is None else f'{t_buff:.0f}s'} vs {'never' if t_sync is None else f'{t_sync:.0f}s'}"
         f"{'' if speedup is None else f' ({speedup:.1f}x)'}"),
        (abs(gap) <= 1.0 or gap > 0, f"final accuracy within 1 point of synchronous FedAvg (or above): {gap:+.2f} points"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 agents, short delays, 2 rounds: a smoke run for CI")
    parser.add_argument("--only", choices=("rounds", "weighting"), help="run part 1 (rounds) or part 2 (weighting) only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data split, the model and the selection")
    parser.add_argument("--temperature", type=float, default=None, help="part 2: kl_temperature (default 1)")
    parser.add_argument("--unbounded", action="store_true",
                        help="part 2: claims uncapped, no delta clipped (the coordinator's default bounds off)")
    args = parser.parse_args(argv)
    skew = SKEW_QUICK if args.quick else SKEW_FULL
    skew = replace(skew, bounded=not args.unbounded,
                   temperature=skew.temperature if args.temperature is None else args.temperature)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)  # many agents share two cores
    started = time.perf_counter()
    verdicts: list[tuple[bool, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-async-") as work, \
            MosquittoBroker(workdir=Path(work) / "broker") as broker:
        if args.only != "weighting":
            verdicts += run_rounds(QUICK if args.quick else FULL, args.quick, args.seed, broker.url, Path(work))
        if args.only != "rounds":
            verdicts += run_skew(skew, args.seed, broker.url, Path(work))
    print()
    for ok, text in verdicts:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    if args.only != "weighting":
        print("\nto N%: wall seconds from the start until a published global model scored N% on the test split; "
              "acc @Bs: the newest model published by then; staleness: mean versions behind of accepted updates; "
              "too stale: updates dropped past max_staleness.")
    print(f"{time.perf_counter() - started:.0f}s in all.")
    return 0


def run_rounds(plan: FleetPlan, quick: bool, seed: int, broker_url: str, work: Path) -> list[tuple[bool, str]]:
    print(f"round policies ({'quick' if quick else 'full'}): {plan.agents} agents cycling jetson/rpi/phone, "
          f"straggler delay {plan.straggler_delay}, {plan.family} on digits ({plan.partition}), {plan.local_epochs} "
          f"local epochs, lr {plan.learning_rate:g}, seed {seed}; target {plan.target:.0%}, budget {plan.budget_s:.0f}s")
    rows = []
    for mode in modes(plan, quick):
        print(f"  running {mode.name} ...", end="", flush=True)
        curve = run_mode(plan, mode, broker_url, work, seed)
        print(f" {curve.versions} versions, final {curve.final:.2%} in {curve.wall_s:.0f}s", flush=True)
        rows.append((mode, curve))
    print()
    print(render(plan, rows))
    return goals(plan, rows)


def run_skew(skew: SkewPlan, seed: int, broker_url: str, work: Path) -> list[tuple[bool, str]]:
    print(f"\nweighting on Dirichlet({skew.alpha:g}), {skew.agents} agents, {skew.rounds} synchronous rounds, "
          f"{skew.family}, T = {skew.temperature:g}, seed {seed}, "
          f"{'the default bounds on influence' if skew.bounded else 'bounds off (claims uncapped, nothing clipped)'}:")
    skew_rows = []
    for weighting in ("samples", "kl"):
        print(f"  running --weighting {weighting} ...", end="", flush=True)
        result = run_weighting(skew, weighting, broker_url, work, seed)
        print(f" {result.accuracy:.2%} in {result.wall_s:.0f}s", flush=True)
        skew_rows.append((f"{weighting}" + (f" (T={skew.temperature:g})" if weighting == "kl" else ""), result))
    print()
    print(render_skew(skew, skew_rows))
    return skew_goals(skew_rows[0][1], skew_rows[1][1])


if __name__ == "__main__":
    sys.exit(main())
