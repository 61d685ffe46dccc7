"""Hooks through which an algorithm shapes local training and the update it produces.

Local training calls, per round: ``begin`` once the model holds the global weights, then per
batch ``extra_loss`` (added to cross-entropy) and ``after_backward`` (may edit gradients),
and finally ``payload`` for the fields of the update.

Under DP (``edge_agent/privacy/dp_training.py`` states the contract) an agent runs only
algorithms with ``dp_compatible = True``: ``extra_loss`` per-sample through the model's
forward pass, ``after_backward`` data-independent (it then sees the privatised gradient),
and raw-data statistics in the payload only through ``prototype_release``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from edge_agent.models import FedModel
from edge_agent.state import AgentStateDir
from edge_agent.weights import get_arrays, subtract
from protocol.errors import ProtocolError, Reason
from protocol.messages import GlobalState

if TYPE_CHECKING:
    from edge_agent.privacy.prototypes import PrototypeRelease


class AlgorithmParams(BaseModel):
    """Announced hyper-parameters; each algorithm subclasses this with its own fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ClientAlgorithm:
    name: ClassVar[str]
    params_model: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    dp_compatible: ClassVar[bool] = False
    """Its hooks keep the DP contract above; an agent with dp on refuses algorithms without it."""
    releases_prototypes: ClassVar[bool] = False
    """Its payload holds statistics of raw records (FedProto); under DP they go through ``prototype_release``."""

    def __init__(self, params: Mapping[str, float | int | bool], state: AgentStateDir) -> None:
        try:
            self.params = self.params_model.model_validate(dict(params))
        except ValidationError as exc:
            raise ProtocolError(Reason.SCHEMA, f"{self.name} parameters: {exc.errors()[0]['msg']}") from None
        self.state = state
        self.base: dict[str, np.ndarray] | None = None
        self.prototype_release: PrototypeRelease | None = None
        """Set by DP training for algorithms that release prototypes; None without DP."""

    def begin(self, model: FedModel, global_state: GlobalState | None, device: torch.device) -> None:
        """``global_state`` is None when the family bootstraps from its seeded init."""
        self.base = get_arrays(model) if global_state is not None else None

    def extra_loss(self, model: FedModel, embeddings: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor | None:
        return None

    def after_backward(self, model: FedModel) -> None:
        return None

    def payload(self, model: FedModel, steps: int, learning_rate: float) -> dict[str, Any]:
        """Update fields: ``delta`` from the global weights, or ``weights`` when bootstrapping."""
        local = get_arrays(model)
        if self.base is None:
            return {"weights": local}
        return {"delta": subtract(local, self.base)}
