"""One agent's local round on the Jetson profile's accelerator against the same round on the CPU.

    python bench/device_rounds.py            # digits (every algorithm; DP off and on), mnist-5k; 3 repetitions
    python bench/device_rounds.py --quick    # digits, fedavg, DP off and on, 2 repetitions (CI: CPU rows only)

Each row times ``LocalWorker.answer`` (the whole round an agent runs when an announcement
arrives: build the model, load the global state, evaluate, train, evaluate, build the update
in host memory) for the Jetson profile's model family (``cnn_large``) at its batch size (64),
with torch on the CPU at the profile's 4 threads, on CUDA in float32 (the agent's default) and on
CUDA with TF32 products (``--tf32``; not with DP, which refuses it), taking turns, median of the repetitions after a warm-up
(``bench/timing.py``). The baseline is the CPU round: what the agent pays where
CUDA is missing (``edge_agent/profiles.py`` falls back to it). Data: one agent's share of an
IID split in 6 (the demo's fleet) for digits, 8 local epochs as in the demo; half of mnist-5k's
training records (28x28, a bigger round) for one epoch. On a machine without CUDA the GPU columns say so and only the CPU is timed.

A data-centre GPU is not a Jetson: the ratio shows that the CUDA path works and where its
fixed costs lie (small rounds are launch-bound), not what an Orin gains.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import median_seconds  # noqa: E402
from edge_agent.data.local import LocalData, build_local_data  # noqa: E402
from edge_agent.privacy.config import DPConfig  # noqa: E402
from edge_agent.privacy.trainer import PrivateTrainer  # noqa: E402
from edge_agent.profiles import get_profile, set_tf32  # noqa: E402
from edge_agent.state import AgentStateDir  # noqa: E402
from edge_agent.tasks.base import Task  # noqa: E402
from edge_agent.tasks.checks import model_fingerprint  # noqa: E402
from edge_agent.tasks.registry import resolve_task  # noqa: E402
from edge_agent.weights import get_arrays  # noqa: E402
from edge_agent.worker import LocalWorker  # noqa: E402
from protocol.messages import GlobalState, LocalTraining, RoundAnnouncement, StateRef  # noqa: E402

JETSON = get_profile("jetson")
PARAMS = {"fedavg": {}, "fedprox": {"mu": 0.01}, "scaffold": {}, "fedproto": {"lambda": 1.0}}


@dataclass(frozen=True)
class Case:
    task: str
    partitions: int
    epochs: int
    algorithm: str
    dp: bool


def cases(quick: bool) -> list[Case]:
    if quick:
        return [Case("digits", 6, 2, "fedavg", dp) for dp in (False, True)]
    out = [Case("digits", 6, 8, algorithm, False) for algorithm in PARAMS]
    out += [Case("digits", 6, 8, algorithm, True) for algorithm in ("fedavg", "fedproto")]
    out += [Case("mnist-5k", 2, 1, "fedavg", dp) for dp in (False, True)]
    return out


def round_inputs(task: Task, family: str, case: Case) -> tuple[RoundAnnouncement, GlobalState | None]:
    model = task.build_model(family, seed=0)
    weights = get_arrays(model)
    names = {name for name, _ in model.named_parameters()}
    control = {n: np.zeros_like(a) for n, a in weights.items() if n in names} if case.algorithm == "scaffold" else {}
    state = None
    if case.algorithm != "fedproto":  # FedProto's first round needs no global state
        digest = GlobalState.compute_digest(weights, control, None, None)
        state = GlobalState(run_id="bench", family=family, round=2, weights=weights, control=control, digest=digest)
    announcement = RoundAnnouncement(
        run_id="bench", round=2, task="train", task_ref=task.card.ref, algorithm=case.algorithm,  # type: ignore[arg-type]
        layouts={family: model_fingerprint(model)}, params=PARAMS[case.algorithm],
        training=LocalTraining(epochs=case.epochs, learning_rate=0.02, momentum=0.0 if case.algorithm == "scaffold" else 0.9),
        selected=["bench-agent"], states={} if state is None else {family: StateRef(family=family, round=2,
                                                                                    digest=state.digest)},
        init_seed=0, issued_at=time.time(), deadline_s=600.0, last_round=10,
    )
    return announcement, state


def make_worker(task: Task, family: str, data: LocalData, device: torch.device, dp: bool, root: Path) -> LocalWorker:
    state = AgentStateDir(root / f"{device.type}-{dp}")
    privacy = None
    if dp:  # a budget no bench run exhausts; prototypes released through their own mechanism
        privacy = PrivateTrainer.open(DPConfig(noise_multiplier=1.0, budget_epsilon=1e6, prototype_noise_multiplier=2.0),
                                      state)
    return LocalWorker("bench-agent", task, family, data, device, JETSON.batch_size, state, privacy)


def with_tf32(worker: LocalWorker, announcement: RoundAnnouncement, state: GlobalState | None) -> object:
    """The round with ``tf32`` on (``edge-agent --tf32``), the agent's default restored after."""
    set_tf32(True)
    try:
        return worker.answer(announcement, state)
    finally:
        set_tf32(False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repetitions", type=int, default=None)
    args = parser.parse_args()
    repetitions = args.repetitions or (2 if args.quick else 3)
    torch.set_num_threads(JETSON.threads)
    cuda = torch.cuda.is_available()
    gpu_name = torch.cuda.get_device_name(0) if cuda else "none (no CUDA device: CPU rows only)"
    print(f"torch {torch.__version__}, {platform.machine()}, CPU at {JETSON.threads} threads; GPU: {gpu_name}")
    set_tf32(False)  # the agent's default
    print(f"{'task':<9} {'family':<9} {'algorithm':<9} {'dp':<3} {'records':>7} {'steps':>5} "
          f"{'cpu ms':>8} {'cuda ms':>8} {'tf32 ms':>8} {'cpu/cuda':>8}")
    with tempfile.TemporaryDirectory(prefix="device-rounds-") as tmp:
        for case in cases(args.quick):
            task = resolve_task(case.task)
            family = task.family_for(JETSON.name)
            data = build_local_data(task, partition="iid" if case.partitions > 1 else "none",
                                    num_partitions=case.partitions, eval_fraction=0.1)
            announcement, state = round_inputs(task, family, case)
            devices = [torch.device("cpu")] + ([torch.device("cuda")] if cuda else [])
            workers = {d.type: make_worker(task, family, data, d, case.dp, Path(tmp)) for d in devices}
            steps = workers["cpu"].answer(announcement, state).metrics.steps
            operations = {name: (lambda w=w, a=announcement, s=state: w.answer(a, s)) for name, w in workers.items()}
            if cuda and not case.dp:  # an agent refuses tf32 with dp (edge_agent/config.py)
                operations["tf32"] = lambda w=workers["cuda"], a=announcement, s=state: with_tf32(w, a, s)
            timed = median_seconds(operations, repetitions)
            tf32 = f"{timed['tf32'] * 1e3:8.1f}" if "tf32" in timed else f"{'-':>8}"
            gpu = (f"{timed['cuda'] * 1e3:8.1f} {tf32} {timed['cpu'] / timed['cuda']:8.2f}"
                   if cuda else f"{'-':>8} {'-':>8} {'-':>8}")
            print(f"{case.task:<9} {family:<9} {case.algorithm:<9} {'on' if case.dp else 'off':<3} "
                  f"{len(data.train):>7} {steps:>5} {timed['cpu'] * 1e3:8.1f} {gpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
