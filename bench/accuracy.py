"""Accuracy of every algorithm on one task's partitions, through the real coordinator and agents.

    python bench/accuracy.py                   # digits: the full table
    python bench/accuracy.py --task mnist-5k   # real 28x28 MNIST: the same table, mnist-5k's plan
    python bench/accuracy.py --quick           # a smoke run for CI (few agents and rounds: numbers mean little)
    python bench/accuracy.py --tune --task mnist-5k [--only alone-few,fedproto-few]   # the tuning grid
    python bench/accuracy.py --only fedproto-few,alone-few     # only the rows whose key starts so

Every federated row runs the real coordinator and agents in this process (threads, each with
its own MQTT connection) over a Mosquitto broker the script starts; rows of one kind share the
partition, partition seed, model initialisation and local shuffles. Accuracy is on the task's
test split that no agent ever sees: of the global model for the FedAvg-family rows; for FedProto
and alone, the mean over agents of their personal model on the test samples of their own classes
(by the model's head; nearest-global-prototype accuracy beside it). "held-out" is the agents' own
validation split in the final evaluation round: the only score tuning (bench/accuracy_tune.py)
looks at. The rows, their settings and goals: bench/task_accuracy.py. "alone" is the same FedProto
run with lambda = 0: the only difference is the alignment (its uploads are unused and not counted).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from task_accuracy import CLASSES_PER_AGENT, Plan, RowSpec, goals, plan_for, row_specs, tuned_for

from edge_agent.tasks import resolve_task
from launcher.broker import MosquittoBroker
from launcher.scenarios import ScenarioResult, centralised, federated

ALGORITHM_COLOURS = {"fedavg": "tab:blue", "fedprox": "tab:green", "scaffold": "tab:red"}


@dataclass
class Row:
    spec: RowSpec
    result: ScenarioResult
    cpu_s: float
    """CPU seconds of this process (every agent and the coordinator) for the row: load-independent."""


def run_row(spec: RowSpec, broker: MosquittoBroker, workdir: Path, task: str) -> Row:
    print(f"  running {spec.name} on {spec.partition} ...", end="", flush=True)
    cpu = time.process_time()
    if spec.kind == "central":
        result = centralised(spec.family, spec.train, spec.rounds, workdir / spec.key, task=task)
    else:
        assert spec.fleet is not None
        result = federated(spec.fleet, spec.train, broker.url, workdir / spec.key,
                           f"bench-{spec.key}".replace(".", "_"), "global" if spec.kind == "global" else "personal")
    row = Row(spec, result, time.process_time() - cpu)
    print(f" {result.accuracy:.2%} in {result.wall_s:.0f}s ({row.cpu_s:.0f} CPU s)", flush=True)
    return row


def has_prototypes(task_name: str) -> bool:
    task = resolve_task(task_name)
    return bool(task.embedding_dim) and len(task.classes) > CLASSES_PER_AGENT


# -- output ---------------------------------------------------------------------------------
def pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2%}"


def render_table(rows: list[Row]) -> str:
    header = (f"{'row':<32} {'family':<12} {'partition':<16} {'rounds':>6} {'test acc':>9} {'by proto':>9} "
              f"{'held-out':>9} {'upload B/agent/rd':>18} {'mean KL':>8} {'s/round':>8} {'time s':>7} {'CPU s':>7}")
    lines = [header, "-" * len(header)]
    for row in rows:
        r, spec = row.result, row.spec
        rounds = f"{spec.rounds}ep" if spec.kind == "central" else str(spec.rounds)
        alone = spec.key.startswith("alone")
        upload = "-" if r.upload_bytes is None or spec.kind == "central" or alone else f"{r.upload_bytes:,.0f}"
        kl = f"{sum(s.kl_divergence for s in r.skew) / len(r.skew):.3f}" if r.skew else "-"
        by_proto = r.extra.get("proto_accuracy") if spec.key.startswith("fedproto") else None
        lines.append(f"{spec.name:<32} {spec.family:<12} {spec.partition:<16} {rounds:>6} {pct(r.accuracy):>9} "
                     f"{pct(by_proto):>9} {pct(r.validation):>9} {upload:>18} {kl:>8} "
                     f"{r.wall_s / max(spec.rounds, 1):>8.2f} {r.wall_s:>7.0f} {row.cpu_s:>7.0f}")
    return "\n".join(lines)


def few_shot_summary(rows: list[Row], plan: Plan) -> list[str]:
    """Mean, spread and per-seed accuracy of the few-shot pair, and FedProto's gain in each seed."""
    by_key = {row.spec.key: row.result.accuracy for row in rows}
    seeds = [s for s in plan.seeds if f"fedproto-few-s{s}" in by_key and f"alone-few-s{s}" in by_key]
    if not seeds:
        return []
    lines = [f"few-shot: {plan.few_shot_agents} agents x {CLASSES_PER_AGENT} classes, at most "
             f"{plan.few_shot_per_class} samples of each (15% of them held out), {len(seeds)} seed(s)"]
    series = {"FedProto": [by_key[f"fedproto-few-s{s}"] for s in seeds],
              "alone": [by_key[f"alone-few-s{s}"] for s in seeds]}
    series["gain (points)"] = [p - a for p, a in zip(series["FedProto"], series["alone"], strict=True)]
    for name, values in series.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        each = "  ".join(f"s{s} {100 * v:6.2f}" for s, v in zip(seeds, values, strict=True))
        lines.append(f"  {name:<14} mean {100 * statistics.fmean(values):6.2f}  sd {100 * spread:5.2f}  "
                     f"min {100 * min(values):6.2f}  max {100 * max(values):6.2f}   {each}")
    return lines


def plot(rows: list[Row], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    for row in rows:
        r, spec = row.result, row.spec
        rounds = range(1, len(r.curve) + 1)
        if spec.kind == "central":
            left.axhline(r.accuracy, color="black", linestyle="--", linewidth=1, label=f"centralised ({r.accuracy:.1%})")
        elif spec.kind == "global":
            algorithm = spec.train.algorithm
            bounded = spec.key.endswith("-bounded")  # the default bounds on influence: drawn apart
            reseeded = "-0.1-s" in spec.key  # the Dir(0.1) pair on other splits: faint, labelled once (seed 0)
            style = "--" if bounded else "-" if "0.1" in spec.partition else "-." if "0.5" in spec.partition else ":"
            label = f"{spec.name.split(' ')[0]} {spec.partition} {spec.family}" + (", default bounds" if bounded else "")
            left.plot(rounds, r.curve, label=None if reseeded else label,
                      color="tab:cyan" if bounded else ALGORITHM_COLOURS[algorithm], linestyle=style,
                      alpha=0.35 if reseeded else 1.0 if spec.key == "fedavg-iid" or spec.partition != "IID" else 0.4)
        else:
            few = "-few" in spec.key
            colour = "tab:purple" if spec.key.startswith("fedproto") else "tab:gray"
            label = f"{spec.name} ({spec.partition})" if not few or spec.key.endswith("-s0") else None
            right.plot(rounds, r.curve, label=label, color=colour, linestyle="-" if few else "--",
                       alpha=0.9 if not few or spec.key.endswith("-s0") else 0.45)
    left.set_title(f"{title}: global model on the test split, after each round")
    right.set_title("Personal models on their classes' test samples (mean over agents)")
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a side with no rows (--only) has nothing to label
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def row_record(row: Row) -> dict[str, Any]:
    r, spec = row.result, row.spec
    return {"name": spec.name, "key": spec.key, "family": spec.family, "partition": spec.partition,
            "kind": spec.kind, "fleet": None if spec.fleet is None else asdict(spec.fleet),
            "train": asdict(spec.train), "accuracy": r.accuracy, "curve": r.curve, "held_out": r.validation,
            "upload_bytes_per_agent_round": r.upload_bytes, "extra": r.extra, "extra_curves": r.extra_curves,
            "wall_s": r.wall_s, "cpu_s": row.cpu_s, "failed_rounds": r.failed_rounds,
            "label_skew": [asdict(s) for s in r.skew]}


def write_json(rows: list[Row], plan: Plan, verdicts: list[tuple[bool, str]], path: Path) -> Path:
    report = {"task": plan.task, "plan": asdict(plan), "torch": torch.__version__,
              "rows": [row_record(r) for r in rows], "goals": [{"pass": ok, "goal": text} for ok, text in verdicts]}
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return path


def run_table(plan: Plan, specs: list[RowSpec], broker: MosquittoBroker, workdir: Path, out: Path,
              quick: bool) -> int:
    task = resolve_task(plan.task)
    print(f"accuracy benchmark ({'quick' if quick else 'full'}): task {plan.task}, torch {torch.__version__}, "
          f"{plan.agents} agents ({plan.per_round} per round) x {plan.rounds} rounds; FedProto {plan.proto_agents} "
          f"agents x {plan.proto_rounds} rounds; few-shot {plan.few_shot_agents} agents x {plan.few_shot_rounds} "
          f"rounds, seeds {', '.join(map(str, plan.seeds))}")
    started, cpu = time.perf_counter(), time.process_time()
    rows = [run_row(spec, broker, workdir, plan.task) for spec in specs]
    verdicts = goals(plan, {row.spec.key: row.result for row in rows}, len(task.classes) * task.embedding_dim * 4)
    print()
    print(render_table(rows))
    print()
    for line in few_shot_summary(rows, plan):
        print(line)
    print()
    for ok, text in verdicts:
        print(f"{'PASS' if ok else 'MISS'}  {text}")
    print()
    print(f"plot {plot(rows, out / 'accuracy.png', plan.task)}, data {write_json(rows, plan, verdicts, out / 'accuracy.json')}; "
          f"{time.perf_counter() - started:.0f}s in all, {time.process_time() - cpu:.0f} CPU s")
    print("test acc: global model on the test split; FedProto and alone rows: mean over agents of the personal model "
          "on the test samples of its 3 classes (by its head; 'by proto': nearest global prototype). held-out: agents' "
          "validation split, final evaluation round. upload: mean accepted update size. mean KL: label skew, "
          "KL(agent || pool) averaged over agents. CPU s: this process's CPU time (all agents' threads). Failed "
          f"rounds: {sum(r.result.failed_rounds for r in rows)}.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few agents and rounds, small models: a smoke run for CI")
    parser.add_argument("--tune", action="store_true", help="run the tuning grid on --task instead of the table")
    parser.add_argument("--task", default="digits", help="any installed classification task [default: digits]")
    parser.add_argument("--only", default=None, help="comma-separated key prefixes: only those rows (with --tune: "
                                                     "only those algorithms, e.g. alone-few,fedproto-few)")
    parser.add_argument("--out", type=Path, default=None, help="where accuracy.png and accuracy.json (tune.json with "
                                                                "--tune) go [default: a new temporary directory]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)  # many agents share two cores: more threads only thrash
    if not resolve_task(args.task).classes:
        parser.error(f"task {args.task} has no classes: this table compares classifiers")
    plan = plan_for(args.task, args.quick)
    only = tuple(args.only.split(",")) if args.only else None
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-accuracy-work-") as work:
        workdir = Path(work)
        with MosquittoBroker(workdir=workdir / "broker") as broker:
            if args.tune:
                import accuracy_tune

                return accuracy_tune.tune(plan, broker, workdir, out / "tune.json", only)
            specs = [s for s in row_specs(plan, tuned_for(args.task), has_prototypes(args.task))
                     if only is None or s.key.startswith(only)]
            return run_table(plan, specs, broker, workdir, out, args.quick)


if __name__ == "__main__":
    sys.exit(main())
