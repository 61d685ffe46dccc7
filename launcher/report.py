"""The end-of-run report: a rich summary table, ``rounds.csv``, ``report.json`` and ``accuracy.png``.

Bytes are as the coordinator counts them: ``bytes_out`` is what it published for a round
(announcement and global states, once; the broker then fans each out to every subscribed
agent), ``bytes_in`` the updates it accepted.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from coordinator.state.rounds import RoundSummary
from launcher.evaluate import CentralEvaluation
from launcher.fleet import FleetSpec
from launcher.progress import OUTCOME_STYLE, fmt_accuracy, human_bytes

CSV_FIELDS = ["round", "task", "outcome", "selected", "answered", "stragglers", "dropouts", "rejected",
              "accuracy", "loss", "train_loss", "bytes_in", "bytes_out", "duration_s", "epsilon_max",
              "budget_exhausted"]


def label_skew(spec: FleetSpec) -> list[dict[str, Any]]:
    """Per agent: samples, classes and KL divergence to the global label distribution of its partition.

    Recomputed with the agents' own seeded partitioner, so it is exactly what they trained on.
    """
    import numpy as np

    from edge_agent.data.partition import make_partition, summarize
    from edge_agent.tasks.registry import resolve_task
    from edge_agent.tasks.splits import pool_and_test

    pool, _ = pool_and_test(resolve_task(spec.task), spec.data, spec.data_seed)
    n = len(spec.agents)
    if spec.partition == "none" or n == 1:
        parts = [np.arange(len(pool))] * n
    else:
        extra = spec.agent_settings
        parts = make_partition(spec.partition, pool.y, n, spec.data_seed, alpha=spec.alpha,
                               min_size=int(extra.get("min_size", 10)),
                               classes_per_client=int(extra.get("classes_per_client", 2)))
    rows = summarize(pool.y, parts, pool.num_classes)
    by_index = {row.client: row for row in rows}
    out = []
    for agent in spec.agents:
        index = agent.partition_index if spec.partition != "none" and n > 1 else 0
        row = by_index[index]
        out.append({"agent": agent.name, "device": agent.device, "family": spec.family_of(agent), "partition": index,
                    "samples": row.samples, "classes": row.classes, "kl_divergence": round(row.kl_divergence, 4)})
    return out


def fleet_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Fleet and label skew", header_style="bold")
    for column, justify in (("agent", "left"), ("device", "left"), ("family", "left"), ("samples", "right"),
                            ("classes", "right"), ("KL to global", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(row["agent"], row["device"], row["family"], str(row["samples"]), str(row["classes"]),
                      f"{row['kl_divergence']:.3f}")
    return table


def summary_table(rounds: list[RoundSummary], total_rounds: int) -> Table:
    families = sorted({f for r in rounds for f in r.families})
    private = any(r.epsilon_max is not None for r in rounds)
    table = Table(title="Rounds", header_style="bold")
    table.add_column("round", justify="right")
    table.add_column("outcome")
    table.add_column("answered", justify="right")
    table.add_column("accuracy", justify="right")
    for family in families:
        table.add_column(family, justify="right")
    for name in ("loss", "bytes in", "bytes out", "time") + (("epsilon max", "exhausted") if private else ()):
        table.add_column(name, justify="right")
    for r in rounds:
        privacy = (fmt_epsilon(r.epsilon_max), str(r.budget_exhausted)) if private else ()
        table.add_row(
            f"{r.round}/{total_rounds}" if r.task == "train" else "eval",
            Text(r.outcome, style=OUTCOME_STYLE.get(r.outcome, "")), f"{r.answered}/{r.selected}",
            fmt_accuracy(r.accuracy),
            *[fmt_accuracy(r.families[f].accuracy) if f in r.families else "-" for f in families],
            "-" if r.loss is None else f"{r.loss:.3f}", human_bytes(r.bytes_in), human_bytes(r.bytes_out),
            f"{r.duration_s:.1f}s", *privacy,
        )
    table.caption = ("accuracy: federated, of the global model each round started from, on the answering "
                     "agents' held-out data ('eval' scores the final models)")
    if private:
        table.caption += ("; epsilon max: the largest DP epsilon any agent had spent by the round's close, "
                          "exhausted: agents whose budget was spent")
    return table


def fmt_epsilon(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def privacy_totals(rounds: list[RoundSummary]) -> dict[str, Any] | None:
    """The fleet's DP spending at the end of the run, or None if no agent trained with DP."""
    spent = [r for r in rounds if r.epsilon_max is not None]
    if not spent:
        return None
    return {"epsilon_max": spent[-1].epsilon_max, "budget_exhausted_agents": spent[-1].budget_exhausted,
            "first_round_with_dp": spent[0].round}


def central_table(evaluation: CentralEvaluation) -> Table:
    table = Table(title=f"Central evaluation on {evaluation.dataset} ({evaluation.test_samples} samples)",
                  header_style="bold")
    for column, justify in (("family", "left"), ("agents", "right"), ("rounds", "right"),
                            ("accuracy", "right"), ("loss", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for family in evaluation.families.values():
        style = "green" if (family.accuracy or 0.0) >= 0.95 else "yellow"
        table.add_row(family.family, str(family.agents), str(family.trained_rounds),
                      Text(fmt_accuracy(family.accuracy), style=style), f"{family.loss:.3f}")
    for name in evaluation.missing:
        table.add_row(name, "-", "0", Text("no model", style="red"), "-")
    table.add_row(Text("overall (mean over agents)", style="bold"), "", "",
                  Text(fmt_accuracy(evaluation.overall_accuracy), style="bold"), "")
    return table


def write_csv(rounds: list[RoundSummary], path: Path) -> Path:
    families = sorted({f for r in rounds for f in r.families})
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_FIELDS + [f"accuracy_{f}" for f in families])
        for r in rounds:
            row = asdict(r)
            writer.writerow([row[k] for k in CSV_FIELDS]
                            + [r.families[f].accuracy if f in r.families else None for f in families])
    return path


def byte_totals(rounds: list[RoundSummary]) -> dict[str, Any]:
    trained = [r for r in rounds if r.task == "train"]
    total_in = sum(r.bytes_in for r in rounds)
    total_out = sum(r.bytes_out for r in rounds)
    return {
        "bytes_in": total_in, "bytes_out": total_out,
        "bytes_in_per_round": total_in / len(rounds) if rounds else 0,
        "bytes_out_per_round": total_out / len(rounds) if rounds else 0,
        "train_rounds": len(trained), "all_rounds": len(rounds),
    }


def write_json(path: Path, *, run: dict[str, Any], rounds: list[RoundSummary], fleet: list[dict[str, Any]],
               evaluation: CentralEvaluation | None) -> Path:
    report = {
        "run": run,
        "fleet": fleet,
        "rounds": [r.to_dict() for r in rounds],
        "bytes": byte_totals(rounds),
        "privacy": privacy_totals(rounds),
        "central_evaluation": evaluation.to_dict() if evaluation is not None else None,
    }
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


def plot(rounds: list[RoundSummary], path: Path, evaluation: CentralEvaluation | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on CI or over ssh
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    trained = [r for r in rounds if r.task == "train"]
    fig, (acc_ax, bytes_ax) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    xs = [r.round for r in trained]
    acc_ax.plot(xs, [r.accuracy for r in trained], "k-o", label="all agents", markersize=3)
    for family in sorted({f for r in rounds for f in r.families}):
        pts = [(r.round, r.families[family].accuracy) for r in trained if family in r.families]
        (line,) = acc_ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", label=family, alpha=0.8)
        final = evaluation.families.get(family) if evaluation is not None else None
        if final is not None and final.accuracy is not None and trained:
            acc_ax.scatter([trained[-1].round + 1], [final.accuracy], marker="*", s=90,
                           color=line.get_color())
    acc_ax.axhline(0.95, color="grey", linestyle=":", linewidth=1)
    acc_ax.set_ylabel("held-out accuracy")
    acc_ax.set_title("Accuracy of the global model at the start of each round (stars: final, central test set)")
    acc_ax.set_ylim(0, 1.02)
    acc_ax.legend(loc="lower right", fontsize=8)
    acc_ax.grid(alpha=0.3)
    width = 0.4
    bytes_ax.bar([x - width / 2 for x in xs], [r.bytes_out / 1e6 for r in trained], width, label="out (published)")
    bytes_ax.bar([x + width / 2 for x in xs], [r.bytes_in / 1e6 for r in trained], width, label="in (updates)")
    bytes_ax.set_xlabel("round (the last star column: after the final round)")
    bytes_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    bytes_ax.set_ylabel("MB (10^6 bytes)")
    bytes_ax.set_title("Bytes per round at the coordinator")
    bytes_ax.legend(fontsize=8)
    bytes_ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
