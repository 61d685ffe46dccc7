"""SCAFFOLD as the paper writes it, in one process: is an oscillating curve the algorithm's or the system's?

    python bench/scaffold_reference.py                      # mnist-5k, Dirichlet 0.1, 10 agents, 30 rounds
    python bench/scaffold_reference.py --task digits --alpha 0.1 --agents 20
    python bench/scaffold_reference.py --quick              # digits, 4 rounds: a smoke run for CI

Karimireddy et al. (ICML 2020), Algorithm 1 with full participation, written here from the paper and
sharing no code with ``edge_agent/algorithms/scaffold.py`` or ``coordinator/strategies/scaffold.py``:
every agent takes K plain SGD steps on ``g_i(y) + c - c_i``, then ``c_i+ = c_i - c + (x - y) / (K lr)``
(option II) or ``c_i+ = g_i(x)``, its full-batch gradient at the round's start (option I); the server
sets ``x += mean(y_i - x)`` and ``c += mean(c_i+ - c_i)``. The same task model, Dirichlet split and
held-out cut as ``bench/accuracy.py``'s agents; no broker, no quantisation, no bounds. Rows:

- fedavg: the same K plain SGD steps, no correction (the baseline of the same optimiser);
- scaffold-II, sample-weighted means (as this project's coordinator runs it);
- scaffold-II-paper, the paper's plain means;
- scaffold-I, option I, sample-weighted.

Each prints its test-accuracy curve, its final accuracy and its largest round-to-round fall after
round 10 (issue 26's stability goal: at most 5 points). Measured on mnist-5k, Dirichlet 0.1, 10 agents
holding 42 to 1,203 training samples, lr 0.05, K 25, batch 32, seed 0 (2026-12-02, about 3 minutes a row):

    variant             final   best   largest fall after round 10
    fedavg              90.50   90.80   7.90
    scaffold-II         83.80   91.10  24.50   (the system, same settings: 91.30 final, 18.30 fall)
    scaffold-II-paper   87.90   89.40  10.00
    scaffold-I           9.70   11.80   (never learns)

The paper's algorithm swings as the system's SCAFFOLD does, with either mean, so the swings are the
algorithm's at this step size and not a fault of its implementation; even uncorrected SGD at this rate
falls by 7.9 points once. The per-class test accuracies (not printed) show whole classes flipping from one
round to the next: the correction ``c - c_i`` is a round old, and on agents holding one or two classes
it overshoots the classifier's rows.

Two stabilisers outside the paper (``--only scaffold-II-clipped,scaffold-II-damped``, 2026-12-03, same
settings) do not remove the swings either: clipping each step's correction to the gradient's norm, per
tensor, gives 85.60 final, 92.20 best, a 21.70 fall; moving c_i half way to option II's value gives 89.20,
91.70, 12.70. A smaller rate does not either (``--lr 0.02 --only fedavg,scaffold-II``): FedAvg 84.10 final
with a 6.50 fall, SCAFFOLD 85.70 with a 15.60 fall (both slower than at 0.05 within 30 rounds).
The paper's global step size below 1 (``--only fedavg-eta0.5,scaffold-II-eta0.5``: x moves by half the mean
delta) smooths FedAvg (81.70 final, 82.20 best, a 1.70 fall) but not SCAFFOLD (68.50, 78.10, a 22.30 fall).

Local momentum 0.9 (outside the paper, as NIID-Bench runs SCAFFOLD: the heavy-ball buffer takes the raw
gradient and the correction moves the weights after each step; 2026-12-03, same split, seed 0):

    variant (lr, K)                     final   best   largest fall after round 10
    fedavg-m0.9 (0.02, 25)              91.50   91.50   7.80
    scaffold-II-m0.9 (0.02, 25)         92.80   92.80  10.10
    fedavg-m0.9 (0.02, 50)              94.90   94.90  11.50
    scaffold-II-m0.9 (0.02, 50)         92.80   94.60  23.00
    scaffold-II-body-m0.9 (0.02, 50)    94.30   94.40  38.30
    fedavg-m0.9-lr0.01 (0.01, 50)       94.60   94.60   1.80
    scaffold-II-m0.9-lr0.01 (0.01, 50)  93.30   95.20  29.40

With momentum SCAFFOLD learns faster early (91.4 at round 11 against FedAvg's 77.4 at lr 0.01, K 50) and
ends 10 points above its plain-SGD self, but it still falls 20-38 points in single rounds and recovers in
two; FedAvg at the same rate does not. K 50 is the sample-weighted mean step count of 2 local epochs here.

The falls come from one agent at a time: per-agent norms (a probe of the lr 0.01 row) show the fall at
round 15 (93.8 to 64.4) in a round where one agent's delta had 5x the others' norm (3.4 against 0.5-0.7;
it held 161 samples, mostly of one class). Clipping every delta and control delta to the round's median
norm, as the coordinator does by default (``max_norm_ratio`` 1; weights unchanged), removes them:

    fedavg-m0.9-lr0.01-clip (0.01, 50)        93.90   93.90   1.70
    scaffold-II-m0.9-lr0.01-clip (0.01, 50)   93.00   94.10   1.40

A decaying local rate (``-decay0.95``: round r at 0.01 x 0.95^r, so 0.006 at round 10 and 0.0024 at the last;
2026-12-04, same split, K 50, one torch thread) does not remove them: SCAFFOLD still fell 32.4 points in one
round (91.8 to 59.4 at round 17) and recovered in three, where FedAvg at the same schedule never fell more
than 0.7:

    fedavg-m0.9-lr0.01-decay0.95 (0.01, 50)      93.00   93.20   0.70
    scaffold-II-m0.9-lr0.01-decay0.95 (0.01, 50) 93.90   94.60  32.40

Variates that are full-batch gradients at one point (2026-12-05, same split; the momentum rows with ``--steps 50``):
``fresh``, the agent's own at the round's start, corrects this round and is sent (the fleet's mean stays a round
old); ``exact`` runs a gradient round first, so every variate and their mean are taken at the round's x (FedLin's
correction), which removes staleness altogether:

    variant (lr, K)                       final   best   largest fall after round 10
    scaffold-fresh (0.05, 25)              8.70   11.80   3.20   (never learns, as option I)
    scaffold-fresh-m0.9-lr0.01 (0.01, 50)  9.70   66.90  27.00
    scaffold-exact (0.05, 25)              8.40   11.60   1.30   (never learns)
    scaffold-exact-m0.9-lr0.01 (0.01, 50) 94.40   95.80   7.10

Exact variates with momentum learn slowly (59.2 at round 7) and still fall 7.1 points late: the falls are not only
the variates' staleness; a one-class agent's correction is large against its own steps wherever it is taken.

A proximal term (``-prox``: each step's gradient gains ``mu (y - x)``, FedProx's term, as FedDyn pairs one with a linear
correction; 2026-12-05, same split, ``--steps 50``): the correction is constant through a round, and once a one-class
agent fits its class nothing in its own loss resists it; the pull back to x would bound how far it goes:

    variant (lr, K)                               final   best   largest fall after round 10
    scaffold-II-m0.9-lr0.01-prox0.01 (0.01, 50)   92.20   95.20  38.00
    scaffold-II-m0.9-lr0.01-prox0.1 (0.01, 50)    95.10   95.10   7.60
    scaffold-II-m0.9-lr0.01-prox1 (0.01, 50)      92.50   92.60   4.00   (slow: 72.6 at round 11)
    scaffold-II-m0.9-lr0.01-prox0.1-clip          94.10   94.40   2.50

It does not hold in the system either: the same term in a trial build of the agent (``mu`` 0.1 on the table's SCAFFOLD
settings, not committed) fell 33.6 points on seed 0 (81.2 to 47.6 at round 13; 94.90 final), 2.3 and 0.5 on seeds 1 and
2 (93.20 and 96.40 final, against 95.6 and 96.4 without it), and 9.1 with the norm clip (90.10 final). Where a single
run's largest fall lands is close to chance at this skew: the clip's 1.4 here was 7.4 in the system.

The paper's plain means with the same momentum (``-paper-m0.9``: x and c move by the unweighted means; 2026-12-05, same
split, ``--steps 50``) do not hold either, and FedAvg swings with them (every other round at first):

    variant (lr, K)                         final   best   largest fall after round 10
    scaffold-II-paper-m0.9-lr0.01 (0.01, 50)  94.90   94.90  19.50
    fedavg-paper-m0.9-lr0.01 (0.01, 50)       93.80   94.10   9.10

A restricted softmax (``-rs``, FedRS: Li and Zhan, KDD 2021; 2026-12-05, same split, ``--steps 50``): in local training
the logits of the classes an agent holds no sample of are multiplied by a factor below 1. The falls are whole classes
flipping, and a one-class agent's cross-entropy pushes the other nine classes' logits down at every step; scaled, they
are pushed less, its variate holds less of that push, and its correction overshoots less:

    variant (lr, K)                           final   best   largest fall after round 10
    scaffold-II-m0.9-lr0.01-rs0.5 (0.01, 50)  94.90   95.30   5.50
    scaffold-II-m0.9-lr0.01-rs0.1 (0.01, 50)  94.30   94.70   4.70
    fedavg-m0.9-lr0.01-rs0.5 (0.01, 50)       94.40   94.40   4.10

The system carries it as ``scaffold_absent_class_scale``; with the norm clip beside it SCAFFOLD's table rows hold on
all three splits (``bench/task_accuracy.py``'s TUNED, mnist-5k).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from edge_agent.data.datasets import Dataset
from edge_agent.data.local import build_local_data
from edge_agent.tasks import resolve_task
from edge_agent.tasks.splits import pool_and_test

Arrays = dict[str, torch.Tensor]
LATE_FROM = 10
"""Falls are counted between rounds after this one."""


@dataclass(frozen=True)
class Variant:
    name: str
    corrected: bool
    weighted: bool
    option: str = "II"
    """The variate: "II" and "I" as the paper's options; outside it, "fresh" (the agent's full-batch gradient at the
    round's start, used in this round's correction and sent), "exact" (a gradient round first: every variate and
    their mean taken at the round's x, as FedLin does)."""
    clip: bool = False
    """Outside the paper: each step's correction c - c_i is scaled, per tensor, to at most the step's gradient norm."""
    damping: float = 1.0
    """Outside the paper: c_i moves only this fraction of the way to option II's new value."""
    server_lr: float = 1.0
    """The paper's global step size eta_g: x += eta_g * mean(y_i - x) (its experiments use 1)."""
    head_corrected: bool = True
    """Outside the paper (False): the classifier head (``head.*``) takes plain SGD steps, the features corrected."""
    momentum: float = 0.0
    """Local heavy-ball momentum on the raw gradient; the correction is applied after each step, outside it."""
    lr: float | None = None
    """This row's local rate (None: ``--lr``)."""
    clip_median: bool = False
    """As the coordinator's default bound: each agent's delta (and control delta) scaled to at most the median norm
    of the round's (weights unchanged)."""
    lr_decay: float = 1.0
    """Outside the paper: round r (from 0) trains at ``lr * lr_decay ** r``."""
    prox_mu: float = 0.0
    """Outside the paper (FedProx's term): each step's gradient gains ``prox_mu * (y - x)``."""
    absent_scale: float = 1.0
    """Outside the paper (FedRS's restricted softmax, Li and Zhan, KDD 2021): in local training the logits of the
    classes an agent holds no sample of are multiplied by this, so its loss pushes their rows down less."""


VARIANTS = (Variant("fedavg", False, True), Variant("scaffold-II", True, True),
            Variant("scaffold-II-paper", True, False), Variant("scaffold-I", True, True, "I"))
EXPERIMENTS = (Variant("scaffold-II-clipped", True, True, clip=True),
               Variant("scaffold-II-damped", True, True, damping=0.5),
               Variant("fedavg-eta0.5", False, True, server_lr=0.5),
               Variant("scaffold-II-eta0.5", True, True, server_lr=0.5),
               Variant("scaffold-II-body", True, True, head_corrected=False),
               Variant("fedavg-m0.9", False, True, momentum=0.9, lr=0.02),
               Variant("scaffold-II-m0.9", True, True, momentum=0.9, lr=0.02),
               Variant("scaffold-II-body-m0.9", True, True, head_corrected=False, momentum=0.9, lr=0.02),
               Variant("fedavg-m0.9-lr0.01", False, True, momentum=0.9, lr=0.01),
               Variant("scaffold-II-m0.9-lr0.01", True, True, momentum=0.9, lr=0.01),
               Variant("fedavg-m0.9-lr0.01-clip", False, True, momentum=0.9, lr=0.01, clip_median=True),
               Variant("scaffold-II-m0.9-lr0.01-clip", True, True, momentum=0.9, lr=0.01, clip_median=True),
               Variant("fedavg-m0.9-lr0.01-decay0.95", False, True, momentum=0.9, lr=0.01, lr_decay=0.95),
               Variant("scaffold-II-m0.9-lr0.01-decay0.95", True, True, momentum=0.9, lr=0.01, lr_decay=0.95),
               Variant("scaffold-fresh", True, True, "fresh"),
               Variant("scaffold-fresh-m0.9-lr0.01", True, True, "fresh", momentum=0.9, lr=0.01),
               Variant("scaffold-exact", True, True, "exact"),
               Variant("scaffold-exact-m0.9-lr0.01", True, True, "exact", momentum=0.9, lr=0.01),
               Variant("scaffold-II-m0.9-lr0.01-prox0.01", True, True, momentum=0.9, lr=0.01, prox_mu=0.01),
               Variant("scaffold-II-m0.9-lr0.01-prox0.1", True, True, momentum=0.9, lr=0.01, prox_mu=0.1),
               Variant("scaffold-II-m0.9-lr0.01-prox1", True, True, momentum=0.9, lr=0.01, prox_mu=1.0),
               Variant("fedavg-m0.9-lr0.01-prox0.1", False, True, momentum=0.9, lr=0.01, prox_mu=0.1),
               Variant("scaffold-II-m0.9-lr0.01-prox0.1-clip", True, True, momentum=0.9, lr=0.01, prox_mu=0.1,
                       clip_median=True),
               Variant("scaffold-II-paper-m0.9-lr0.01", True, False, momentum=0.9, lr=0.01),
               Variant("fedavg-paper-m0.9-lr0.01", False, False, momentum=0.9, lr=0.01),
               Variant("scaffold-II-m0.9-lr0.01-rs0.5", True, True, momentum=0.9, lr=0.01, absent_scale=0.5),
               Variant("fedavg-m0.9-lr0.01-rs0.5", False, True, momentum=0.9, lr=0.01, absent_scale=0.5),
               Variant("scaffold-II-m0.9-lr0.01-rs0.1", True, True, momentum=0.9, lr=0.01, absent_scale=0.1))
"""Not in the default rows (``--only`` names them): stabilisers outside the paper, tried for issue 26."""


def clipped_to_median(deltas: list[Arrays], names: list[str]) -> list[Arrays]:
    """Each of ``deltas`` scaled to at most the median of their L2 norms (over the floating ``names``)."""
    norms = [sum(float((d[k].double() ** 2).sum()) for k in names if d[k].is_floating_point()) ** 0.5 for d in deltas]
    bound = float(np.median(norms))
    return [{k: v * (bound / n) if n > bound and v.is_floating_point() else v for k, v in d.items()}
            for d, n in zip(deltas, norms, strict=True)]


def largest_late_fall(curve: list[float]) -> float:
    """The largest drop from one round to the next after round LATE_FROM (0 when it never falls)."""
    late = curve[LATE_FROM - 1:]
    return max([0.0] + [a - b for a, b in zip(late, late[1:], strict=False)])


class Reference:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        task = resolve_task(args.task)
        self.data = [build_local_data(task, partition="dirichlet", num_partitions=args.agents, partition_index=i,
                                      alpha=args.alpha, data_seed=args.seed).train for i in range(args.agents)]
        _, test = pool_and_test(task, seed=args.seed)
        self.test = (torch.as_tensor(test.x), torch.as_tensor(test.y))
        self.model = task.build_model(task.family_for("jetson"), args.seed)
        self.start = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.names = [k for k, _ in self.model.named_parameters()]
        self.classes = task.num_outputs

    def run(self, variant: Variant) -> list[float]:
        args, names = self.args, self.names
        samples = np.array([len(d) for d in self.data], dtype=float)
        weights = samples / samples.sum() if variant.weighted else np.full(len(samples), 1 / len(samples))
        x = {k: v.clone() for k, v in self.start.items()}
        c = {k: torch.zeros_like(x[k]) for k in names}
        controls = [{k: torch.zeros_like(x[k]) for k in names} for _ in self.data]
        shuffles = torch.Generator().manual_seed(args.seed + 1)
        curve = []
        for number in range(args.rounds):
            deltas, control_deltas = [], []
            if variant.option == "exact":
                controls = [self.full_gradient(x, data) for data in self.data]
                c = {k: sum(float(w) * g[k] for w, g in zip(weights, controls, strict=True)) for k in names}
            for i, data in enumerate(self.data):
                y, new_control = self.local(x, c, controls[i], data, variant, shuffles, number)
                deltas.append({k: y[k] - x[k] for k in x})
                control_deltas.append({k: new_control[k] - controls[i][k] for k in names})
                controls[i] = new_control
            if variant.clip_median:
                deltas = clipped_to_median(deltas, list(x))
                control_deltas = clipped_to_median(control_deltas, names) if variant.corrected else control_deltas
            step = variant.server_lr
            x = {k: x[k] + step * sum(float(w) * d[k] for w, d in zip(weights, deltas, strict=True)) if k in c
                 else x[k] + sum(float(w) * d[k] for w, d in zip(weights, deltas, strict=True)) for k in x}
            if variant.corrected and variant.option != "exact":
                c = {k: c[k] + sum(float(w) * d[k] for w, d in zip(weights, control_deltas, strict=True)) for k in names}
            curve.append(100 * self.accuracy(x))
        return curve

    def full_gradient(self, x: Arrays, data: Dataset) -> Arrays:
        """The gradient of ``data``'s whole loss at ``x`` (the model has GroupNorm: no batch statistics to disturb)."""
        self.model.load_state_dict(x)
        self.model.train()
        self.model.zero_grad()
        F.cross_entropy(self.model(torch.as_tensor(data.x)), torch.as_tensor(data.y)).backward()
        return {k: p.grad.detach().clone() for k, p in self.model.named_parameters()}

    def local(self, x: Arrays, c: Arrays, control: Arrays, data: Dataset, variant: Variant,
              shuffles: torch.Generator, number: int) -> tuple[Arrays, Arrays]:
        """One agent's round ``number`` (from 0): (its trained state y, its new control variate c_i+)."""
        args, names, model = self.args, self.names, self.model
        at_start = self.full_gradient(x, data) if variant.option in ("I", "fresh") else {}
        model.load_state_dict(x)
        model.train()
        params = dict(model.named_parameters())
        inputs, labels = torch.as_tensor(data.x), torch.as_tensor(data.y)
        lr = (args.lr if variant.lr is None else variant.lr) * variant.lr_decay ** number
        velocity = {k: torch.zeros_like(params[k]) for k in names}
        held = torch.bincount(labels, minlength=self.classes) > 0
        logit_scale = torch.where(held, 1.0, variant.absent_scale)
        for batch in batches(len(labels), args.batch, args.steps, shuffles):
            model.zero_grad()
            F.cross_entropy(model(inputs[batch]) * logit_scale, labels[batch]).backward()
            with torch.no_grad():
                for k in names:
                    grad = params[k].grad
                    if variant.prox_mu:
                        grad = grad + variant.prox_mu * (params[k] - x[k])
                    corrected = variant.corrected and (variant.head_corrected or not k.startswith("head."))
                    own = at_start[k] if variant.option == "fresh" else control[k]
                    correction = c[k] - own if corrected else torch.zeros_like(grad)
                    if variant.clip:
                        size = float(correction.norm())
                        if size > 0:
                            correction = correction * min(1.0, float(grad.norm()) / size)
                    if variant.momentum:
                        velocity[k].mul_(variant.momentum).add_(grad)
                        params[k].sub_(lr * (velocity[k] + correction))
                    else:
                        params[k].sub_(lr * (grad + correction))
        y = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if not variant.corrected:
            return y, control
        if variant.option in ("I", "fresh"):
            return y, at_start
        if variant.option == "exact":
            return y, control  # the next gradient round replaces it
        target = {k: control[k] - c[k] + (x[k] - y[k]) / (args.steps * lr) for k in names}
        return y, {k: control[k] + variant.damping * (target[k] - control[k]) for k in names}

    def accuracy(self, state: Arrays) -> float:
        self.model.load_state_dict(state)
        self.model.eval()
        inputs, labels = self.test
        with torch.no_grad():
            return (self.model(inputs).argmax(1) == labels).float().mean().item()


def batches(n: int, size: int, steps: int, shuffles: torch.Generator):  # noqa: ANN201 (a generator of index tensors)
    """Exactly ``steps`` mini-batches, in reshuffled passes over ``n`` samples (as ``LocalTraining.steps``)."""
    taken = 0
    while True:
        order = torch.randperm(n, generator=shuffles)
        for start in range(0, n, size):
            if taken == steps:
                return
            taken += 1
            yield order[start:start + size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="mnist-5k")
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=25, help="K: local SGD steps per round")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="comma-separated variant names")
    parser.add_argument("--quick", action="store_true", help="digits, 6 agents, 4 rounds, K 5")
    args = parser.parse_args()
    if args.quick:
        args.task, args.agents, args.rounds, args.steps, args.batch = "digits", 6, 4, 5, 16
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    reference = Reference(args)
    chosen = [v for v in VARIANTS + EXPERIMENTS if (v in VARIANTS and args.only is None)
              or (args.only is not None and v.name in args.only.split(","))]
    if not chosen:
        sys.exit(f"--only {args.only}: no such variant (variants: {', '.join(v.name for v in VARIANTS + EXPERIMENTS)})")
    print(f"# SCAFFOLD reference: {args.task}, Dirichlet {args.alpha}, {args.agents} agents (all per round), "
          f"{args.rounds} rounds, lr {args.lr}, K {args.steps}, batch {args.batch}, seed {args.seed}, "
          f"samples {[len(d) for d in reference.data]}; torch {torch.__version__}")
    print(f"| variant | final | best | largest fall after round {LATE_FROM} | curve |")
    print("|---|---|---|---|---|")
    for variant in chosen:
        curve = reference.run(variant)
        fall = f"{largest_late_fall(curve):.2f}" if len(curve) > LATE_FROM else "-"
        print(f"| {variant.name} | {curve[-1]:.2f} | {max(curve):.2f} | {fall} | "
              f"{' '.join(f'{a:.1f}' for a in curve)} |", flush=True)


if __name__ == "__main__":
    main()
