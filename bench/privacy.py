"""Accuracy against epsilon: DP-SGD on 10 agents through the real round engine, beside central DP-SGD.

    python bench/privacy.py            # no DP, then epsilon 8, 3 and 1 (delta 1e-5): 50 rounds, 3 runs each
    python bench/privacy.py --quick    # no DP and epsilon 8, 10 rounds, 1 run: a minute or two, for CI

Federated: 10 agents, each with an IID share of the digits training pool, run as threads
with their own MQTT connections to a Mosquitto this script starts, driven by the real
coordinator (``launcher.inprocess.run_federation``). Each agent trains the ``mlp_tiny`` model
with Opacus DP-SGD, its noise calibrated once to reach epsilon after the planned rounds; the
guarantee protects each agent's records from the coordinator and everyone downstream.

Central: the same model trained in this process with Opacus's own ``PrivacyEngine``
(``make_private_with_epsilon``, Poisson sampling, RDP accountant) on the union of the agents'
records, at the same epsilon and delta, with the same clipping norm, learning rate and
momentum, one epoch per round, and as many steps per epoch as each agent takes per round
(so the same number of noisy steps, each sampling about the same fraction of the records).
Both models are scored on the held-back test split, which no one trains on.

Goal: at epsilon 8, federated accuracy within 5 points of central DP-SGD. Local DP-SGD pays
for its small local data: each agent's noise is scaled to its own ~144 records, and averaging
10 independent noises leaves sqrt(10) more noise than one central mechanism over all records.

The script exits 0 whatever the accuracies (a MISS is printed, not raised); it exits 1 only if
a run fails or an agent's reported epsilon passes its target.
"""

from __future__ import annotations

import argparse
import logging
import math
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import opacus
import torch
import torch.nn.functional as F
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset

from coordinator.settings import CoordinatorSettings
from edge_agent.config import AgentSettings
from edge_agent.data.datasets import Dataset
from edge_agent.data.partition import make_partition
from edge_agent.privacy.dp_training import RoundShape
from edge_agent.tasks.registry import resolve_task
from edge_agent.tasks.splits import pool_and_test
from edge_agent.training import evaluate
from launcher.broker import MosquittoBroker
from launcher.evaluate import score_weights
from launcher.inprocess import run_federation

GOAL_POINTS = 5.0
GOAL_EPSILON = 8.0
DELTA = 1e-5
AGENTS = 10
TASK = resolve_task("digits")
FAMILY = "mlp_tiny"
BATCH = 64
"""Per agent: ~144 records, so each step samples ~44% of them."""
LEARNING_RATE = 1.0
"""With DP: every per-sample gradient is clipped to CLIP, so steps stay bounded at this rate."""
LEARNING_RATE_NO_DP = 0.3
"""Without DP nothing bounds the steps: 1.0 diverges; the no-DP reference uses a rate that trains well."""
MOMENTUM = 0.5
CLIP = 1.0
DATA_SEED = 0


@dataclass
class Result:
    epsilon: float | None
    federated: list[float]
    """Test accuracy of the final global model, one per repetition."""
    central: list[float]
    agent_epsilon: float | None
    """Largest epsilon an agent reported spending, as the coordinator saw it, over the repetitions."""
    central_epsilon: float | None
    sigma_agents: float | None
    sigma_central: float | None
    wall_s: float

    @property
    def gap(self) -> float:
        """Mean central minus mean federated accuracy, in points."""
        return 100 * (float(np.mean(self.central)) - float(np.mean(self.federated)))


def learning_rate(epsilon: float | None) -> float:
    return LEARNING_RATE_NO_DP if epsilon is None else LEARNING_RATE


def agent_shares(pool: Dataset) -> list[np.ndarray]:
    """The IID shares the agents hold: recomputed with their own seeded partitioner."""
    return make_partition("iid", pool.y, AGENTS, DATA_SEED)


def run_federated(broker_url: str, epsilon: float | None, rounds: int, workdir: Path,
                  repetition: int) -> tuple[dict, float | None, float | None]:
    """(final global weights, largest epsilon reported, the agents' calibrated sigma); fresh agents each time."""
    label = ("none" if epsilon is None else f"eps{epsilon:g}".replace(".", "_")) + f"-{repetition}"
    coordinator = CoordinatorSettings(
        federation=f"privacy-bench-{label}", broker_url=broker_url, state_dir=workdir / label / "coordinator",
        rounds=rounds, local_epochs=1, learning_rate=learning_rate(epsilon), momentum=MOMENTUM, batch_size=BATCH,
        min_available_agents=AGENTS, min_fit_agents=AGENTS, quorum_fraction=1.0, round_deadline_s=600,
        agent_timeout_s=900, evaluate_final=False, seed=0, init_seed=0, log_level="WARNING")
    dp = {} if epsilon is None else {"dp": True, "dp_target_epsilon": epsilon, "dp_planned_rounds": rounds,
                                     "dp_delta": DELTA, "dp_max_grad_norm": CLIP}
    agents = [AgentSettings(
        federation=coordinator.federation, broker_url=broker_url, device="phone", family=FAMILY,
        agent_id=f"agent-{i}", state_dir=workdir / label / f"agent-{i}", partition="iid", num_partitions=AGENTS,
        partition_index=i, data_seed=DATA_SEED, eval_fraction=0.0, heartbeat_s=2.0, log_level="WARNING", **dp)
        for i in range(AGENTS)]
    result = run_federation(coordinator, agents, timeout_s=3600)
    completed = [r for r in result.history if r.outcome == "completed"]
    if len(completed) != rounds:
        raise RuntimeError(f"{len(completed)} of {rounds} rounds completed: {[r.outcome for r in result.history]}")
    trainers = [a.worker.privacy for a in result.agents if a.worker.privacy is not None]
    sigma = None
    if trainers and trainers[0].ledger.calibration is not None:
        sigma = float(trainers[0].ledger.calibration["noise_multiplier"])
    reported = result.history[-1].epsilon_max
    return result.strategy.states[FAMILY].weights, reported, sigma


def run_central(pool: Dataset, shares: list[np.ndarray], epsilon: float | None, rounds: int,
                seed: int) -> tuple[torch.nn.Module, float | None, float | None]:
    """(model, epsilon spent, sigma): Opacus's standard recipe over the union of the agents' records."""
    records = np.concatenate(shares)
    x, y = torch.from_numpy(pool.x[records]), torch.from_numpy(pool.y[records])
    # As many steps per epoch as an agent takes per round; Opacus then samples at 1 / steps.
    steps = RoundShape.of(round(float(np.mean([len(s) for s in shares]))), BATCH, 1).steps
    batch = math.ceil(len(y) / steps)
    torch.manual_seed(seed)
    model = TASK.build_model(FAMILY, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate(epsilon), momentum=MOMENTUM)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)
    engine = None
    if epsilon is not None:
        engine = PrivacyEngine(accountant="rdp")
        model, optimizer, loader = engine.make_private_with_epsilon(
            module=model, optimizer=optimizer, data_loader=loader, target_epsilon=epsilon, target_delta=DELTA,
            epochs=rounds, max_grad_norm=CLIP, poisson_sampling=True)
    model.train()
    for _ in range(rounds):  # one pass per round, as each agent makes one local epoch per round
        for inputs, labels in loader:
            if len(labels) == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
    if engine is None:
        return model, None, None
    return model._module, engine.get_epsilon(DELTA), optimizer.noise_multiplier  # type: ignore[union-attr]


def accuracy(model: torch.nn.Module, test: Dataset) -> float:
    return evaluate(model, test, torch.device("cpu"), TASK.objective).accuracy  # type: ignore[arg-type, return-value]


def measure(broker_url: str, epsilon: float | None, rounds: int, repeats: int, workdir: Path, pool: Dataset,
            test: Dataset, shares: list[np.ndarray]) -> Result:
    started = time.perf_counter()
    result = Result(epsilon, [], [], None, None, None, None, 0.0)
    for repetition in range(repeats):  # DP noise differs every run: one run is one draw
        weights, reported, sigma = run_federated(broker_url, epsilon, rounds, workdir, repetition)
        central, central_epsilon, central_sigma = run_central(pool, shares, epsilon, rounds, seed=repetition)
        result.federated.append(score_weights(FAMILY, weights, test, TASK).accuracy)  # type: ignore[arg-type]
        result.central.append(accuracy(central, test))
        if reported is not None:
            result.agent_epsilon = max(reported, result.agent_epsilon or 0.0)
        if central_epsilon is not None:
            result.central_epsilon = max(central_epsilon, result.central_epsilon or 0.0)
        result.sigma_agents, result.sigma_central = sigma, central_sigma
        print(f"  epsilon {'none' if epsilon is None else f'{epsilon:g}'} run {repetition + 1}/{repeats}: federated "
              f"{result.federated[-1]:.2%}, central {result.central[-1]:.2%} "
              f"({time.perf_counter() - started:.0f}s)", flush=True)
    result.wall_s = time.perf_counter() - started
    return result


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def fmt_runs(values: list[float]) -> str:
    """Mean accuracy, with the range over repetitions when there are several."""
    mean = f"{np.mean(values):.2%}"
    return mean if len(values) == 1 else f"{mean} ({100 * min(values):.1f}-{100 * max(values):.1f})"


def print_table(results: list[Result], rounds: int, repeats: int) -> None:
    print()
    header = (f"{'epsilon':>7}  {'federated':>20}  {'central DP-SGD':>20}  {'gap (points)':>12}  "
              f"{'agents eps spent':>16}  {'central eps':>11}  {'sigma agents':>12}  {'sigma central':>13}  "
              f"{'time s':>6}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{fmt(r.epsilon, 'g') if r.epsilon else 'no DP':>7}  {fmt_runs(r.federated):>20}  "
              f"{fmt_runs(r.central):>20}  "
              f"{r.gap:>12.1f}  {fmt(r.agent_epsilon, '.3f'):>16}  {fmt(r.central_epsilon, '.3f'):>11}  "
              f"{fmt(r.sigma_agents, '.3f'):>12}  {fmt(r.sigma_central, '.3f'):>13}  {r.wall_s:>6.0f}")
    print()
    print(f"federated: {AGENTS} agents (IID digits shares), {rounds} rounds of 1 local epoch, batch {BATCH}, "
          f"momentum {MOMENTUM}, lr {LEARNING_RATE} with DP (clip {CLIP}), {LEARNING_RATE_NO_DP} without; central: "
          f"the same over all their records, {rounds} epochs. Delta {DELTA:g}. Gap: central minus federated, "
          f"in accuracy points on the held-back test split, of the means over {repeats} run(s) "
          "(range in parentheses).")
    for r in results:
        if r.epsilon == GOAL_EPSILON:
            mark = "PASS" if r.gap <= GOAL_POINTS else "MISS"
            print(f"{mark}  epsilon {GOAL_EPSILON:g}: federated {np.mean(r.federated):.2%} vs central DP-SGD "
                  f"{np.mean(r.central):.2%}, gap {r.gap:.1f} points (goal <= {GOAL_POINTS:g})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="no DP and epsilon 8 only, 10 rounds (for CI)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (and central epochs); default 50, quick 10")
    parser.add_argument("--repeats", type=int, default=None, help="runs per epsilon, averaged; default 3, quick 1")
    args = parser.parse_args(argv)
    rounds = args.rounds or (10 if args.quick else 50)
    repeats = args.repeats or (1 if args.quick else 3)
    epsilons: list[float | None] = [None, GOAL_EPSILON] if args.quick else [None, 8.0, 3.0, 1.0]

    torch.set_num_threads(1)  # ten agents share this process; more threads only thrash
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("edge_agent").setLevel(logging.ERROR)  # each agent says when its planned rounds are spent
    warnings.filterwarnings("ignore", message="Secure RNG turned off")  # central: not a production run
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
    print(f"privacy benchmark: python {platform.python_version()}, torch {torch.__version__}, "
          f"opacus {opacus.__version__}, {platform.machine()}; {rounds} rounds, {repeats} run(s) each, epsilons "
          + ", ".join("none" if e is None else f"{e:g}" for e in epsilons), flush=True)
    pool, test = pool_and_test(TASK, seed=DATA_SEED)
    shares = agent_shares(pool)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="fl-privacy-bench-") as tmp:
        workdir = Path(tmp)
        with MosquittoBroker(workdir=workdir / "broker") as broker:
            for epsilon in epsilons:
                results.append(measure(broker.url, epsilon, rounds, repeats, workdir, pool, test, shares))
    print_table(results, rounds, repeats)
    overspent = [r for r in results if r.epsilon is not None
                 and (r.agent_epsilon is None or r.agent_epsilon > r.epsilon + 1e-9 or math.isnan(r.agent_epsilon))]
    if overspent:
        print(f"error: agents reported epsilon past their target: {[(r.epsilon, r.agent_epsilon) for r in overspent]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
