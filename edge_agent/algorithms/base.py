"""Hooks through which an algorithm shapes local training and the update it produces.

Per round the worker calls ``load`` (put the round's starting weights into the model: the
global ones, or FedProto's personal model). An evaluation round then asks ``metrics`` of that
model. A training round calls ``check_plan``, ``begin``, then per batch ``extra_loss`` (added
to cross-entropy), ``after_backward`` (edits gradients) and ``after_step`` (edits the weights the
optimizer just stepped), then ``payload`` for the fields of
the update, ``metrics`` of the trained model, and, once the update has passed validation,
``commit`` to make the round's durable state stick. ``payload`` itself must write nothing: a
round that diverges is dropped and must not leave its state behind.

``extra_loss`` terms depend on the batch (FedProto's alignment); ``after_backward`` and
``after_step`` edits are data-independent (FedProx's proximal gradient, SCAFFOLD's correction),
so under DP-SGD they belong after clipping and noise, where they cost no privacy.

Under DP (``edge_agent/privacy/dp_training.py`` states the contract) an agent runs only
algorithms with ``dp_compatible = True``: ``extra_loss`` per-sample through the model's
forward pass, ``after_backward`` and ``after_step`` data-independent (they then see the
privatised gradient and the weights it stepped),
and raw-data statistics in the payload only through ``prototype_release``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.state import AgentStateDir
from edge_agent.training import TrainResult
from edge_agent.weights import get_arrays, set_arrays, subtract
from protocol.errors import ProtocolError, Reason
from protocol.messages import GlobalState, LocalTraining

if TYPE_CHECKING:
    from edge_agent.privacy.prototypes import PrototypeRelease


class AlgorithmParams(BaseModel):
    """Announced hyper-parameters; each algorithm subclasses this with its own fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class RoundContext:
    """Which run, round and model family an algorithm works for: durable state is keyed by them."""

    run_id: str
    round: int
    family: str
    device: torch.device


class ClientAlgorithm:
    name: ClassVar[str]
    params_model: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    dp_compatible: ClassVar[bool] = False
    """Its hooks keep the DP contract above; an agent with dp on refuses algorithms without it."""
    releases_prototypes: ClassVar[bool] = False
    """Its payload holds statistics of raw records (FedProto); under DP they go through ``prototype_release``."""

    def __init__(self, params: Mapping[str, float | int | bool], state: AgentStateDir, context: RoundContext) -> None:
        try:
            self.params = self.params_model.model_validate(dict(params))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise ProtocolError(Reason.SCHEMA, f"{self.name} parameter {where}: {error['msg']}") from None
        self.state = state
        self.context = context
        self.base: dict[str, np.ndarray] | None = None
        self.prototype_release: PrototypeRelease | None = None
        """Set by DP training for algorithms that release prototypes; None without DP."""

    def load(self, model: FedModel, global_state: GlobalState | None) -> None:
        """Start from the family's global weights; ``global_state`` is None when it bootstraps."""
        if global_state is not None:
            set_arrays(model, global_state.weights)

    @property
    def absent_class_scale(self) -> float:
        """The factor local training puts on the logits of classes the agent holds none of (1: none)."""
        return 1.0

    def check_plan(self, plan: LocalTraining) -> None:
        """Raise ProtocolError if the announced local training does not suit this algorithm."""

    def begin(self, model: FedModel, global_state: GlobalState | None) -> None:
        """Called once the model holds the round's starting weights, before the first step."""
        self.base = get_arrays(model) if global_state is not None else None

    def extra_loss(self, model: FedModel, embeddings: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor | None:
        return None

    def after_backward(self, model: FedModel) -> None:
        return None

    def after_step(self, model: FedModel) -> None:
        return None

    def payload(self, model: FedModel, train: Dataset, result: TrainResult, plan: LocalTraining) -> dict[str, Any]:
        """Update fields: ``delta`` from the global weights, or ``weights`` when bootstrapping."""
        return model_fields(get_arrays(model), self.base)

    def metrics(self, model: FedModel, held_out: Dataset) -> dict[str, float]:
        """Extra metrics of ``model`` (reported in ``TrainMetrics.extra``)."""
        return {}

    def commit(self) -> None:
        """Persist what this round changed on the device (SCAFFOLD's variate, FedProto's personal
        model); called only for an update that is about to be sent."""
        return None


def model_fields(trained: dict[str, np.ndarray], base: dict[str, np.ndarray] | None) -> dict[str, Any]:
    """``{"delta": trained - base}``, or ``{"weights": trained}`` when bootstrapping (no base)."""
    return {"weights": trained} if base is None else {"delta": subtract(trained, base)}


def parameter_names(model: torch.nn.Module) -> list[str]:
    """Trainable parameters in state-dict naming; buffers (running statistics, counters) excluded."""
    return [name for name, p in model.named_parameters() if p.requires_grad]
