"""Attack harness: make an agent Byzantine. FOR TESTS AND BENCHMARKS ONLY; off by default.

Enabled by the agent setting ``attack`` (``--attack sign_flip|scaling|gaussian_noise|
label_flip|alie``, with ``--attack-scale`` or ``--attack-z``). An attacking agent says so
loudly in its log at start and admits it in every update's ``metrics.extra``
(``attack_<name>: 1`` and its parameters), so a bench can tell who attacked.
"""

from __future__ import annotations

from edge_agent.attacks.behaviours import (
    Attack,
    AttackContext,
    GaussianNoise,
    LabelFlip,
    LittleIsEnough,
    Scaling,
    SignFlip,
    flip_labels,
    forge_payload,
)
from edge_agent.attacks.collusion import Collusion, HonestEstimate, InProcessCollusion

DEFAULT_SCALE = {"sign_flip": 4.0, "scaling": 10.0, "gaussian_noise": 100.0}
"""Strong enough that a plain mean with 10-30% attackers collapses on digits (bench/robust.py)."""
DEFAULT_Z = 1.0


def build_attack(name: str, *, scale: float | None = None, z: float | None = None,
                 collusion: Collusion | None = None, claim_samples: int | None = None,
                 report_accuracy: float | None = None) -> Attack | None:
    """The attack called ``name`` ("none": None), lying about its sample count and the global model's accuracy
    when asked. ``alie`` needs a ``collusion`` rendezvous."""
    attack = _forger(name, scale, z, collusion)
    return None if attack is None else attack.lie(claim_samples=claim_samples, report_accuracy=report_accuracy)


def _forger(name: str, scale: float | None, z: float | None, collusion: Collusion | None) -> Attack | None:
    if name == "none":
        return None
    if name in DEFAULT_SCALE:
        s = DEFAULT_SCALE[name] if scale is None else scale
        return {"sign_flip": SignFlip, "scaling": Scaling, "gaussian_noise": GaussianNoise}[name](s)
    if name == "label_flip":
        return LabelFlip()
    if name == "alie":
        if collusion is None:
            raise ValueError("attack alie needs colluders to estimate honest updates: run the agents in one process "
                             "with a shared rendezvous (launcher.inprocess.run_federation(..., collusion=...))")
        return LittleIsEnough(DEFAULT_Z if z is None else z, collusion)
    raise ValueError(f"unknown attack {name!r}")


__all__ = [
    "DEFAULT_SCALE", "DEFAULT_Z", "Attack", "AttackContext", "Collusion", "GaussianNoise", "HonestEstimate",
    "InProcessCollusion", "LabelFlip", "LittleIsEnough", "Scaling", "SignFlip", "build_attack", "flip_labels",
    "forge_payload",
]
