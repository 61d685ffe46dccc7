"""What differential privacy an agent applies: the DP part of its settings, free of pydantic.

Two ways to set the noise (checked at start-up by ``AgentSettings``):

- ``noise_multiplier``: a fixed sigma; ``budget_epsilon`` (optional) stops training before
  epsilon would pass it;
- ``target_epsilon`` over ``planned_rounds``: sigma is calibrated once, at the first training
  round (when the announced epochs and batch size are known), and kept in the state dir; the
  budget defaults to the target, so the agent stops after the planned rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from edge_agent.config import AgentSettings

Mechanism = Literal["rdp", "prv"]
"""Upper bounds only: Opacus's gdp (a central-limit approximation) can under-report, so it is not offered."""


@dataclass(frozen=True)
class DPConfig:
    max_grad_norm: float = 1.0
    delta: float = 1e-5
    accountant: Mechanism = "rdp"
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    planned_rounds: int | None = None
    budget_epsilon: float | None = None
    prototype_noise_multiplier: float | None = None
    """Gaussian mechanism on FedProto prototypes; None refuses to release prototypes under DP."""
    prototype_clip: float = 1.0
    """L2 norm each embedding is clipped to before it enters a prototype."""

    def __post_init__(self) -> None:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("give exactly one of noise_multiplier and target_epsilon")
        if self.target_epsilon is not None and self.planned_rounds is None:
            raise ValueError("target_epsilon needs planned_rounds")

    @property
    def stop_epsilon(self) -> float | None:
        """Training stops before epsilon would pass this; None never stops."""
        return self.budget_epsilon if self.budget_epsilon is not None else self.target_epsilon

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> DPConfig:
        """The DP settings of an agent that has ``dp`` on."""
        return cls(
            max_grad_norm=settings.dp_max_grad_norm, delta=settings.dp_delta, accountant=settings.dp_accountant,
            noise_multiplier=settings.dp_noise_multiplier, target_epsilon=settings.dp_target_epsilon,
            planned_rounds=settings.dp_planned_rounds, budget_epsilon=settings.dp_budget_epsilon,
            prototype_noise_multiplier=settings.dp_prototype_noise_multiplier,
            prototype_clip=settings.dp_prototype_clip,
        )
