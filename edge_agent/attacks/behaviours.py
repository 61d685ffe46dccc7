"""Byzantine behaviours an agent can be told to adopt. FOR TESTS AND BENCHMARKS ONLY.

Each attack may poison the training labels and then forges the model update from the
honest one. Updates are handled as deltas; in a bootstrap round, where an honest agent sends
the untrained seeded initialisation, the attack forges those weights themselves.
Integer arrays pass through untouched.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.attacks.collusion import Collusion
from edge_agent.data.datasets import Dataset
from edge_agent.training import EvalResult

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class AttackContext:
    agent_id: str
    run_id: str
    round: int
    family: str

    def seed(self) -> int:
        return zlib.crc32(f"attack:{self.agent_id}:{self.run_id}:{self.round}".encode())


def _map_floats(delta: Mapping[str, np.ndarray], fn: Callable[[np.ndarray], np.ndarray]) -> Arrays:
    return {name: (fn(a).astype(a.dtype) if a.dtype.kind == "f" else a) for name, a in delta.items()}


def flip_labels(data: Dataset) -> Dataset:
    """Label y becomes C - 1 - y (on digits: 0 <-> 9, 1 <-> 8, ...)."""
    return Dataset(data.x, (data.num_classes - 1 - data.y).astype(data.y.dtype), data.num_classes,
                   f"{data.name}-flipped")


class Attack:
    name: ClassVar[str]
    poisons_labels: ClassVar[bool] = False
    claim_samples: int | None = None
    """Lie about the training samples behind every update (its weight); None: the truth."""
    report_accuracy: float | None = None
    """Lie about the held-out accuracy of the global model in every evaluation; None: the truth."""

    def lie(self, *, claim_samples: int | None, report_accuracy: float | None) -> Attack:
        self.claim_samples, self.report_accuracy = claim_samples, report_accuracy
        return self

    def misreport(self, result: EvalResult) -> EvalResult:
        """The evaluation it sends instead of ``result``: the claimed samples and accuracy where it lies."""
        return dataclasses.replace(
            result, accuracy=result.accuracy if self.report_accuracy is None else self.report_accuracy,
            samples=result.samples if self.claim_samples is None else self.claim_samples)

    def poison(self, data: Dataset) -> Dataset:
        return flip_labels(data) if self.poisons_labels else data

    def forge(self, delta: Arrays, context: AttackContext) -> Arrays:
        """The malicious delta sent instead of ``delta`` (the one trained on the possibly poisoned data)."""
        return delta

    def describe(self) -> str:
        return self.name

    def report(self) -> dict[str, float]:
        """What the agent admits in its update's metrics, so benches can tell who attacked."""
        lies = {"attack_claim_samples": self.claim_samples, "attack_report_accuracy": self.report_accuracy}
        return {f"attack_{self.name}": 1.0, **{k: float(v) for k, v in lies.items() if v is not None}}


class SignFlip(Attack):
    """Send -s times the honest delta."""

    name = "sign_flip"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def forge(self, delta: Arrays, context: AttackContext) -> Arrays:
        return _map_floats(delta, lambda a: -self.scale * a.astype(np.float64))

    def describe(self) -> str:
        return f"sign_flip (x -{self.scale:g})"

    def report(self) -> dict[str, float]:
        return {**super().report(), "attack_scale": self.scale}


class Scaling(Attack):
    """Model replacement (Bagdasaryan et al., 2020): train a poisoned model (flipped labels)
    and send its delta boosted by s, about the number of agents, so that a plain mean of the
    round is (nearly) replaced by the poisoned model."""

    name = "scaling"
    poisons_labels = True

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def forge(self, delta: Arrays, context: AttackContext) -> Arrays:
        return _map_floats(delta, lambda a: self.scale * a.astype(np.float64))

    def describe(self) -> str:
        return f"scaling (poisoned model, delta x {self.scale:g})"

    def report(self) -> dict[str, float]:
        return {**super().report(), "attack_scale": self.scale}


class GaussianNoise(Attack):
    """Send pure noise: every value drawn from N(0, sigma^2), sigma = s x the RMS of the honest delta."""

    name = "gaussian_noise"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def forge(self, delta: Arrays, context: AttackContext) -> Arrays:
        floats = [a.astype(np.float64).ravel() for a in delta.values() if a.dtype.kind == "f"]
        total = sum(a.size for a in floats)
        rms = float(np.sqrt(sum(float(a @ a) for a in floats) / total)) if total else 0.0
        rng = np.random.default_rng(context.seed())
        return _map_floats(delta, lambda a: rng.normal(0.0, self.scale * rms, size=a.shape))

    def describe(self) -> str:
        return f"gaussian_noise (sigma = {self.scale:g} x RMS of the honest delta)"

    def report(self) -> dict[str, float]:
        return {**super().report(), "attack_scale": self.scale}


class LabelFlip(Attack):
    """Train honestly on flipped labels (y -> C - 1 - y) and send that delta as is."""

    name = "label_flip"
    poisons_labels = True


class LittleIsEnough(Attack):
    """"A little is enough" (Baruch et al., 2019): send mean - z * std of the honest updates.

    The colluding attackers estimate mean and std from their own benign updates, pooled
    through ``collusion``; a small z hides the update inside the honest spread while every
    attacker pushes the same way.
    """

    name = "alie"

    def __init__(self, z: float, collusion: Collusion) -> None:
        self.z = z
        self.collusion = collusion
        self.last_members = 0

    def forge(self, delta: Arrays, context: AttackContext) -> Arrays:
        honest = self.collusion.pool((context.run_id, context.round, context.family), context.agent_id, delta)
        self.last_members = honest.members
        return {name: ((honest.mean[name] - self.z * honest.std[name]).astype(a.dtype) if a.dtype.kind == "f" else a)
                for name, a in delta.items()}

    def describe(self) -> str:
        return f"alie (mean - {self.z:g} x std of the colluders' benign updates)"

    def report(self) -> dict[str, float]:
        return {**super().report(), "attack_z": self.z, "attack_colluders": float(self.last_members)}


def forge_payload(attack: Attack, payload: dict[str, object], init: Mapping[str, np.ndarray] | None,
                  context: AttackContext) -> dict[str, object]:
    """Apply ``attack`` to an update's payload: ``delta``, or a bootstrap proposal's ``weights`` themselves.

    A bootstrap proposal is the untrained initial model (``init``): there is no delta to forge, so the
    attack forges the absolute weights, as a device trying to choose the family's first state would
    (noise 1,000x their RMS, weights scaled or flipped 9x)."""
    out = dict(payload)
    if payload.get("delta"):
        out["delta"] = attack.forge(payload["delta"], context)  # type: ignore[arg-type]
    elif payload.get("weights"):
        weights: Mapping[str, np.ndarray] = payload["weights"]  # type: ignore[assignment]
        forged = attack.forge(dict(weights), context)
        out["weights"] = {k: (forged[k].astype(w.dtype) if w.dtype.kind == "f" else w) for k, w in weights.items()}
    return out
