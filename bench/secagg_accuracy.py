"""bench/secagg.py --accuracy: the final accuracy of a digits FedAvg run, secure against plain (issue 25).

    python bench/secagg.py --accuracy           # 10 agents (all per round), Dir(0.5), cnn_large, 20 rounds
    python bench/secagg.py --accuracy --quick   # 4 agents, IID, the rpi family's small model, 3 rounds (CI)
    python bench/secagg.py --accuracy --algorithm fedproto [--quick]   # FedProto, three families (below)

The same fleet runs twice in one process over one Mosquitto (launcher.scenarios.federated: the real
coordinator and agents on threads, each with its own MQTT connection): plain FedAvg, then FedAvg
with ``secure_aggregation`` on. Same partition (data seed 0), model initialisation (init seed 0),
local shuffles (seeded from agent, init seed and round, not the run), and task_accuracy's tuned
digits FedAvg settings (lr 0.05, momentum 0, 4 local epochs, batch 16). The influence bounds are off
in both (``LEARNING_BOUNDS``: secure aggregation refuses ``max_norm_ratio``), so the only difference
is the secure path: every agent clips each value of its delta to [-clip, clip], weighs it,
quantises it to a grid of 2^32 / agents levels and masks it; the coordinator unmasks the sum.

The clip: the coordinator's default ``secagg_clip`` 0.5. Measured on digits before choosing
(2026-12-02): the round-1 deltas of this fleet (every agent training 4 epochs from the initial
model; from the final model they are 7x smaller) are at most 0.17 in absolute value, so 0.5 clips nothing
there. The bench checks that again on each run: a probe trains every agent's partition once from
the initial model and from the plain run's final model, and prints the largest |value| and the
share of values over the clip. Clipped values would cost accuracy; the probe says if any were.

Accuracy: of the global model after the last training round on the test split no agent sees.
Rounds: round 1 is the bootstrap (every agent sends the seeded initial model, untrained, in the clear
by design: nothing is learned from data), as in bench/accuracy.py; the other rounds train, and in the
secure run each is aggregated securely ("secure rounds" counts them).
Round time: the mean ``duration_s`` of the learning rounds (rounds.jsonl, announcement to close;
the bootstrap left out of both).
Measured (2026-12-02, 2 shared cores, 70 s in all): plain 96.66%, secure 96.94%: +0.28 points, which
is one of the 359 test samples (the finest step this test split can show); PASS. Rounds 1.50 s plain,
1.68 s secure (1.12x). Probe: largest |delta| 0.169 from the initial model, 0.025 from the final one,
no value over the clip 0.5. Secure rounds log a few late reveals (``dropped secagg ... late``): the
unmasking closes once it holds enough shares, and the rest arrive after it.

``--algorithm fedproto``: 9 agents of the three device families (jetson, rpi, phone: three model families,
three agents each), 3 classes per agent, 20 rounds (quick: 6 agents, 3 rounds), task_accuracy's tuned digits
FedProto settings, scored as bench/accuracy.py scores FedProto (each agent's personal model on the test samples
of its classes; the mean). Secure from round 1: prototypes are learned from data, and their layout is the
task's, so there is no plain bootstrap. Each agent clips every prototype value to [-clip, clip] (default
``secagg_prototype_clip`` 8.0) and weighs each class by its count; the coordinator unmasks per family the
per-class sums and counts. The probe computes every agent's prototypes from the initial model and from its
personal model at the end of the plain run, and prints the largest |value| and the share over the clip.
Measured (2026-12-03, 47 s in all): plain 99.50%, secure 99.50% (largest gap over the 20 rounds 0.22 points);
PASS. Rounds 0.96 s plain, 1.05 s secure (1.09x). Probe: largest |value| 1.24 from the initial models, 4.06
from the final personal ones, none over the clip 8. Three classes per agent on digits leave little to learn
(99.5%): the bench shows the secure path costs nothing, not that FedProto helps.

``--noise z --clip-norm C``: the secure FedAvg run adds distributed DP (``secagg_noise_multiplier``,
``secagg_dp_clip_norm``); the table's last line gives the coordinator's epsilon. Measured (2026-12-03, the full
plan, C 1.5 from the probe's largest L2 norm 1.33 of a round-1 delta): plain 96.66%; z 0.1: 88.30% (epsilon 1231),
z 0.3: 47.35% (epsilon 176), z 1: 10.03% (epsilon 29), 19 noisy sums at delta 1e-5. Ten agents cannot hide a
useful signal: the noise on the mean is z C / sum(w) per value, against deltas of norm about 1 spread over
every parameter; central DP of this kind needs hundreds of agents a round.

Exits 1 if a run fails a round or the secure run aggregated a training round in the clear; the
accuracy goal (|secure - plain| <= 0.5 points) is printed PASS/MISS, and timings never fail it.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from task_accuracy import CLASSES_PER_AGENT, LEARNING_BOUNDS, PROTO_DEVICES, train_config, tuned_for

from coordinator.state.checkpoint import CHECKPOINT, CheckpointStore
from coordinator.state.rounds import RoundSummary
from coordinator.state.rounds_log import RoundsLog
from edge_agent.algorithms import RoundContext
from edge_agent.algorithms.fedavg import FedAvgClient
from edge_agent.algorithms.fedproto import FILE_PREFIX
from edge_agent.data.local import build_local_data
from edge_agent.prototypes import class_prototypes, embed_all
from edge_agent.state import AgentStateDir
from edge_agent.tasks import resolve_task
from edge_agent.training import train_local
from edge_agent.weights import set_arrays
from launcher.broker import MosquittoBroker
from launcher.scenarios import FleetConfig, ScenarioResult, TrainConfig, federated
from protocol.messages import LocalTraining

TASK = "digits"
GOAL_POINTS = 0.5
CLIPS = {"fedavg": 0.5, "fedproto": 8.0}
"""--clip's default per algorithm: the coordinator's secagg_clip, or its secagg_prototype_clip."""
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Plan:
    agents: int
    rounds: int
    family: str
    partition: str
    alpha: float
    clip: float
    stage_s: float
    """secagg_stage_s: each stage closes as soon as every agent answered; this is only its deadline."""
    batch_size: int = 16
    algorithm: str = "fedavg"
    noise: float = 0.0
    """Distributed DP in the secure run: secagg_noise_multiplier (0: none)."""
    clip_norm: float = 1.0
    """secagg_dp_clip_norm: the L2 bound of each agent's delta under noise."""
    mechanism: str = "skellam"
    """secagg_noise_mechanism under noise: skellam (integer, on the grid) or gaussian."""

    @property
    def name(self) -> str:
        return {"fedavg": "FedAvg", "fedproto": "FedProto"}[self.algorithm]


def plan_for(quick: bool, clip: float | None, algorithm: str = "fedavg") -> Plan:
    task = resolve_task(TASK)
    clip = CLIPS[algorithm] if clip is None else clip
    if algorithm == "fedproto":  # three families: the device profiles' models (the family field is unused)
        return Plan(6, 3, "", "classes", 0.5, clip, 30.0, algorithm=algorithm) if quick else Plan(
            9, 20, "", "classes", 0.5, clip, 30.0, algorithm=algorithm)
    if quick:  # seconds per round: the numbers mean little
        return Plan(4, 3, task.family_for("rpi"), "iid", 0.5, clip, 30.0)
    return Plan(10, 20, task.family_for("jetson"), "dirichlet", 0.5, clip, 30.0)


def fleet_for(plan: Plan) -> FleetConfig:
    if plan.algorithm == "fedproto":
        return FleetConfig(plan.agents, PROTO_DEVICES, "classes", classes_per_client=CLASSES_PER_AGENT, task=TASK)
    return FleetConfig(plan.agents, ("cpu",), plan.partition, alpha=plan.alpha, family=plan.family, task=TASK)


@dataclass
class Run:
    mode: str
    result: ScenarioResult
    rounds: list[RoundSummary]

    @property
    def trained(self) -> list[RoundSummary]:
        return [r for r in self.rounds if r.task == "train"]

    first: int = 2
    """The first learning round (FedAvg's round 1 is the bootstrap: no training, no masking; FedProto has none)."""

    @property
    def secure_rounds(self) -> int:
        return sum(r.secure is not None for r in self.trained)

    @property
    def round_s(self) -> float:
        """Mean seconds of the learning rounds."""
        learning = [r.duration_s for r in self.trained if r.round >= self.first]
        return float(np.mean(learning)) if learning else float("nan")


def settings(plan: Plan, secure: bool) -> TrainConfig:
    train = train_config(plan.algorithm, tuned_for(TASK)[plan.algorithm], plan.rounds, 1.0, plan.batch_size)
    params: dict[str, Any] = {**train.params, **LEARNING_BOUNDS}
    if secure:
        # federated() sets round_deadline_s to its timeout (an hour): far above 2 x secagg_stage_s.
        clip = "secagg_prototype_clip" if plan.algorithm == "fedproto" else "secagg_clip"
        params |= {"secure_aggregation": True, clip: plan.clip, "secagg_stage_s": plan.stage_s}
        if plan.noise:
            params |= {"secagg_noise_multiplier": plan.noise, "secagg_dp_clip_norm": plan.clip_norm,
                       "secagg_noise_mechanism": plan.mechanism}
    return replace(train, params=params)


def run_mode(plan: Plan, fleet: FleetConfig, secure: bool, broker: MosquittoBroker, workdir: Path) -> Run:
    mode = "secure" if secure else "plain"
    print(f"  running {mode} {plan.name} ...", end="", flush=True)
    result = federated(fleet, settings(plan, secure), broker.url, workdir / mode, f"secagg-accuracy-{mode}",
                       "personal" if plan.algorithm == "fedproto" else "global")
    run = Run(mode, result, list(RoundsLog(workdir / mode / "coordinator" / "rounds.jsonl").read()),
              first=1 if plan.algorithm == "fedproto" else 2)
    print(f" {result.accuracy:.2%} in {result.wall_s:.0f}s", flush=True)
    return run


def final_weights(workdir: Path, family: str) -> dict[str, np.ndarray] | None:
    """The plain run's last global model of ``family``, from its coordinator checkpoint (None if not found)."""
    data = CheckpointStore(workdir / "plain" / "coordinator").load(CHECKPOINT) or {}
    state = ((data.get("strategy") or {}).get("families") or {}).get(family)
    weights = state.get("weights") if isinstance(state, dict) else None
    return weights if isinstance(weights, dict) else None


def clip_probe(plan: Plan, fleet: FleetConfig, weights: dict[str, np.ndarray] | None) -> tuple[float, float, float]:
    """(largest |delta value|, share of values over the clip, largest L2 norm of a delta) of every agent training
    once from ``weights`` (None: the initial model) with the run's settings; what the secure run's agents clip (and
    under distributed DP scale to secagg_dp_clip_norm) is of this kind."""
    task = resolve_task(TASK)
    hyper = settings(plan, False)
    largest, over, total, norm = 0.0, 0, 0, 0.0
    with tempfile.TemporaryDirectory(prefix="secagg-probe-") as tmp:
        for i in range(plan.agents):
            local = build_local_data(task, partition=fleet.partition, num_partitions=plan.agents, partition_index=i,
                                     alpha=fleet.alpha, data_seed=fleet.data_seed)
            model = task.build_model(plan.family, seed=hyper.seed)
            if weights is not None:
                set_arrays(model, weights)
            before = {k: v.detach().clone() for k, v in model.state_dict().items()}
            hooks = FedAvgClient({}, AgentStateDir(Path(tmp) / str(i)), RoundContext("probe", 0, plan.family, CPU))
            training = LocalTraining(epochs=hyper.local_epochs, learning_rate=hyper.learning_rate,
                                     momentum=hyper.momentum or 0.0)
            train_local(model, local.train, training, plan.batch_size, CPU, hooks, seed=i, objective=task.objective)
            squares = 0.0
            for name, value in model.state_dict().items():
                if value.dtype.is_floating_point:
                    delta = (value - before[name]).abs()
                    largest = max(largest, float(delta.max()))
                    over += int((delta > plan.clip).sum())
                    total += delta.numel()
                    squares += float((delta.double() ** 2).sum())
            norm = max(norm, squares ** 0.5)
    return largest, over / max(total, 1), norm


def prototype_probe(plan: Plan, fleet: FleetConfig, workdir: Path | None) -> tuple[float, float, float]:
    """(largest |prototype value|, share of values over the clip) of every agent's class prototypes from the
    initial model (``workdir`` None) or from its personal model at the end of the plain run in ``workdir``."""
    task = resolve_task(TASK)
    hyper = settings(plan, False)
    normalize = bool(hyper.params.get("proto_normalize", False))
    largest, over, total = 0.0, 0, 0
    for i in range(plan.agents):
        device = fleet.devices[i % len(fleet.devices)]
        local = build_local_data(task, partition=fleet.partition, num_partitions=plan.agents, partition_index=i,
                                 classes_per_client=fleet.classes_per_client, data_seed=fleet.data_seed)
        family = task.family_for(device)
        model = task.build_model(family, seed=hyper.seed)
        if workdir is not None:
            state = AgentStateDir(workdir / "plain" / "agents" / f"{device}-{i}")
            names = state.names(FILE_PREFIX)
            personal = state.read_arrays(names[0]) if names else None
            if personal is None:
                raise RuntimeError(f"{device}-{i} kept no personal model in the plain run")
            set_arrays(model, personal)
        embeddings, _ = embed_all(model, local.train, CPU, normalize)
        prototypes, counts = class_prototypes(embeddings, local.train.y, local.train.num_classes, normalize)
        rows = np.abs(prototypes[counts > 0])
        largest = max(largest, float(rows.max()))
        over += int((rows > plan.clip).sum())
        total += rows.size
    return largest, over / max(total, 1), float("nan")


def render(plain: Run, secure: Run, plan: Plan) -> list[str]:
    lines = ["| run | test acc | rounds completed | secure rounds | mean round s | wall s |", "|---|---|---|---|---|---|"]
    for run in (plain, secure):
        done = sum(r.outcome == "completed" for r in run.trained)
        lines.append(f"| {run.mode} {plan.name} | {run.result.accuracy:.2%} | {done}/{len(run.trained)} "
                     f"| {run.secure_rounds}/{len(run.trained)} | {run.round_s:.2f} | {run.result.wall_s:.0f} |")
    diff = 100 * (secure.result.accuracy - plain.result.accuracy)
    gaps = [abs(a - b) * 100 for a, b in zip(plain.result.curve, secure.result.curve, strict=False)]
    lines += ["", f"difference secure - plain: {diff:+.2f} points (largest gap over the {len(gaps)} scored rounds: "
                  f"{max(gaps, default=float('nan')):.2f} points)",
              f"round time secure / plain: {secure.round_s / plain.round_s:.2f}x "
              f"({secure.round_s:.2f} s vs {plain.round_s:.2f} s per round)",
              f"{'PASS' if abs(diff) <= GOAL_POINTS else 'MISS'}  secure {plan.name} within {GOAL_POINTS} points of plain "
              f"{plan.name} after {plan.rounds} rounds: {diff:+.2f} points"]
    noisy = [r.secure["noise"] for r in secure.trained if r.secure and r.secure.get("noise")]
    if plan.noise:
        last = noisy[-1] if noisy else None
        lines.append("distributed DP: no noisy sum was released" if last is None else
                     f"distributed DP ({last.get('mechanism', 'gaussian')}): noise multiplier {last['noise_multiplier']:g}, "
                     f"clip norm {last['clip_norm']:g}, "
                     f"split {last['shares']} ways; epsilon {last['epsilon']:.4g} at delta {last['delta']:g} after "
                     f"{last['rounds']} noisy sums (no sampling amplification claimed)")
    return lines


def failures(plain: Run, secure: Run) -> list[str]:
    out = [f"{run.mode}: round {r.round} {r.outcome} ({r.detail or r.reason})"
           for run in (plain, secure) for r in run.trained if r.outcome != "completed"]
    if plain.secure_rounds:
        out.append(f"plain: {plain.secure_rounds} rounds aggregated securely")
    # FedAvg's bootstrap round (no global state yet) runs in the clear by design; every other must be secure.
    clear = [r.round for r in secure.trained if r.secure is None and r.round >= secure.first]
    if clear or not secure.secure_rounds:
        out.append(f"secure: training rounds aggregated in the clear: {clear or 'all'}")
    return out


def run(quick: bool, clip: float | None, algorithm: str = "fedavg", noise: float = 0.0,
        clip_norm: float = 1.0, mechanism: str = "skellam") -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)  # many agents share the cores: more threads only thrash
    plan = replace(plan_for(quick, clip, algorithm), noise=noise, clip_norm=clip_norm, mechanism=mechanism)
    fleet = fleet_for(plan)
    proto = algorithm == "fedproto"
    split = (f"{CLASSES_PER_AGENT} classes/agent, families of {', '.join(PROTO_DEVICES)}" if proto else
             "IID" if plan.partition == "iid" else f"Dir({plan.alpha:g})")
    train = settings(plan, True)
    clip_name = "secagg_prototype_clip" if proto else "secagg_clip"
    print(f"# secure vs plain {plan.name} ({'quick' if quick else 'full'}): {TASK}, {plan.family or 'three families'}, "
          f"{plan.agents} agents (all per round), {split}, {plan.rounds} rounds, lr {train.learning_rate:g} momentum "
          f"{train.momentum:g} {train.local_epochs} local epochs batch {plan.batch_size}; {clip_name} {plan.clip:g}, "
          f"secagg_stage_s {plan.stage_s:g}; bounds off"
          f"{f'; secagg_noise_multiplier {plan.noise:g} ({plan.mechanism}), secagg_dp_clip_norm {plan.clip_norm:g}' if plan.noise else ''}"
          f"; torch {torch.__version__}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="secagg-accuracy-") as tmp:
        workdir = Path(tmp)
        with MosquittoBroker(workdir=workdir / "broker") as broker:
            plain = run_mode(plan, fleet, False, broker, workdir)
            secure = run_mode(plan, fleet, True, broker, workdir)
        if proto:
            probes = [("initial model", prototype_probe(plan, fleet, None)),
                      ("personal model at the end of the plain run", prototype_probe(plan, fleet, workdir))]
            last: dict[str, np.ndarray] | None = {}
        else:
            probes = [("initial model", clip_probe(plan, fleet, None))]
            last = final_weights(workdir, plan.family)
            if last is not None:
                probes.append(("plain run's final model", clip_probe(plan, fleet, last)))
    print()
    for line in render(plain, secure, plan):
        print(line)
    for where, (largest, share, norm) in probes:
        what = "prototypes of every agent from its" if proto else "every agent training once from the"
        l2 = "" if np.isnan(norm) else f"; largest L2 norm {norm:.4f}"
        print(f"clip probe, {what} {where}: largest |{'value' if proto else 'delta'}| {largest:.4f}, "
              f"{share:.4%} of values over the clip {plan.clip:g}{l2}")
    if last is None:
        print("clip probe from the final model: skipped (no global state found in the plain run's checkpoint)")
    problems = failures(plain, secure)
    for problem in problems:
        print(f"FAIL  {problem}")
    scored = ("each agent's personal model on the test samples of its classes (the mean)" if proto
              else "the global model after the last round on the test split")
    print(f"{time.perf_counter() - started:.0f}s in all. test acc: {scored}; mean round s: rounds.jsonl duration_s "
          f"of the learning rounds (announcement to close).")
    return 1 if problems else 0
