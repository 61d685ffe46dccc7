"""``bench/accuracy.py --tune``: the tuning grid behind a task's TUNED settings (bench/task_accuracy.py).

The same budget of four runs per algorithm, on the task given, each chosen by the agents' held-out
accuracy only (the test column is printed for the record, never used to choose): FedAvg lr {0.01,
0.05} x momentum {0, 0.9} on Dirichlet 0.1; FedProx mu {0.001, 0.01, 0.1, 1} at FedAvg's choice;
SCAFFOLD (momentum 0 by definition) lr {0.01, 0.02, 0.05, 0.1}; alone lr {0.02, 0.05} x local
epochs {2, 4} on the 3-class fleet; FedProto lambda {0.3, 1, 2}, and 1 with a 5-round warm-up and
server momentum 0.5, at alone's choice; alone-few and fedproto-few the same two grids on the
few-shot fleet, with local epochs {4, 8} (an agent holds 2 or 3 batches). Every run uses seed 0
(partition, held-out split, initialisation, shuffles).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from task_accuracy import Plan, global_fleet, proto_fleet, train_config, tuned_for

from launcher.broker import MosquittoBroker
from launcher.scenarios import FleetConfig, TrainConfig, federated


def _base(hyper: dict[str, Any]) -> dict[str, Any]:
    return {k: hyper[k] for k in ("learning_rate", "momentum", "local_epochs")}


def _alone(epochs: tuple[int, int]) -> Callable[[dict[str, dict[str, Any]]], list[dict[str, Any]]]:
    def grid(chosen: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"learning_rate": lr, "momentum": 0.9, "local_epochs": e, "params": {"proto_lambda": 0.0}}
                for lr in (0.02, 0.05) for e in epochs]
    return grid


def _fedproto(alone: str) -> Callable[[dict[str, dict[str, Any]]], list[dict[str, Any]]]:
    def grid(chosen: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        base = _base(chosen[alone])
        return ([{**base, "params": {"proto_lambda": lam}} for lam in (0.3, 1.0, 2.0)]
                + [{**base, "params": {"proto_lambda": 1.0, "proto_warmup_rounds": 5, "proto_momentum": 0.5}}])
    return grid


GRID: list[tuple[str, Callable[[dict[str, dict[str, Any]]], list[dict[str, Any]]]]] = [
    # (algorithm, its candidates given the choices so far), in order: FedProx starts from FedAvg's choice.
    ("fedavg", lambda chosen: [{"learning_rate": lr, "momentum": m, "local_epochs": chosen["fedavg"]["local_epochs"]}
                               for lr in (0.01, 0.05) for m in (0.0, 0.9)]),
    ("fedprox", lambda chosen: [{**_base(chosen["fedavg"]), "params": {"prox_mu": mu}}
                                for mu in (0.001, 0.01, 0.1, 1.0)]),
    ("scaffold", lambda chosen: [{**chosen["scaffold"], "learning_rate": lr, "momentum": m}
                                 for lr in (0.01, 0.05) for m in (0.0, 0.9)]),  # FedAvg's grid
    ("alone", _alone((2, 4))),
    ("fedproto", _fedproto("alone")),
    ("alone-few", _alone((4, 8))),  # 2 or 3 batches an epoch: more epochs a round
    ("fedproto-few", _fedproto("alone-few")),
]


def _setting(plan: Plan, algorithm: str, hyper: dict[str, Any]) -> tuple[FleetConfig, TrainConfig, str]:
    if algorithm.startswith(("alone", "fedproto")):
        few = algorithm.endswith("-few")
        rounds = plan.few_shot_rounds if few else plan.proto_rounds
        return (proto_fleet(plan, few_shot=few), train_config(algorithm, hyper, rounds, 1.0, plan.proto_batch_size),
                "personal")
    return (global_fleet(plan, "dirichlet", 0.1), train_config(algorithm, hyper, plan.rounds, plan.fraction,
                                                                plan.batch_size), "global")


def tune(plan: Plan, broker: MosquittoBroker, workdir: Path, out: Path, only: tuple[str, ...] | None) -> int:
    """Each algorithm's candidates, in GRID order (only those in ``only``, if given; the others keep
    their TUNED settings); the best held-out accuracy wins, the first of equals."""
    chosen = tuned_for(plan.task)
    runs: list[dict[str, Any]] = []
    print(f"tuning on task {plan.task} (held-out accuracy chooses; test acc is never used)")
    print(f"{'algorithm':<13} {'settings':<92} {'samples':>7} {'held-out':>9} {'test acc':>9}")
    for algorithm, candidates in GRID:
        if only is not None and algorithm not in only:
            continue
        scored = []
        for index, hyper in enumerate(candidates(chosen)):
            fleet, train, score = _setting(plan, algorithm, hyper)
            name = f"tune-{algorithm}-{index}"
            result = federated(fleet, train, broker.url, workdir / name, name, score)  # type: ignore[arg-type]
            samples = sum(s.samples for s in result.skew)
            scored.append((result.validation or 0.0, hyper))
            runs.append({"algorithm": algorithm, "settings": hyper, "held_out": result.validation,
                         "test": result.accuracy, "samples": samples, "curve": result.curve})
            held, test = result.validation, result.accuracy
            print(f"{algorithm:<13} {json.dumps(hyper, sort_keys=True):<92} {samples:>7} "
                  f"{'-' if held is None else f'{held:.2%}':>9} {test:>9.2%}", flush=True)
        chosen[algorithm] = max(scored, key=lambda pair: pair[0])[1]
    tuned = {a: chosen[a] for a, _ in GRID if only is None or a in only}
    print(f"\nchosen (TUNED[{plan.task!r}] in bench/task_accuracy.py):")
    for algorithm, hyper in tuned.items():
        print(f"  {algorithm!r}: {json.dumps(hyper, sort_keys=True)},")
    out.write_text(json.dumps({"task": plan.task, "runs": runs, "chosen": tuned}, indent=1) + "\n")
    print(f"data {out}")
    return 0
