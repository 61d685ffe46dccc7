"""FedProx on the agent: local SGD on cross-entropy plus ``mu/2 * ||w - w_start||^2``.

``w_start`` are the weights the round started from (the global ones, or the seeded
initialisation in a bootstrap round). The term's gradient, ``mu * (w - w_start)``, is added
to each parameter's gradient after the backward pass rather than built into the autograd
graph: the same objective, no extra graph, and a data-independent edit (see base). With
``mu = 0`` the added gradient is exactly zero, so training is bit-identical to FedAvg.
"""

from __future__ import annotations

from pydantic import Field

from edge_agent.algorithms.base import AlgorithmParams, ClientAlgorithm
from edge_agent.algorithms.registry import register_client
from edge_agent.models import FedModel
from protocol.messages import GlobalState


class FedProxParams(AlgorithmParams):
    mu: float = Field(ge=0.0, le=100.0)


class FedProxClient(ClientAlgorithm):
    name = "fedprox"
    dp_compatible = True  # the proximal gradient is data-independent: applied in after_backward
    params_model = FedProxParams
    params: FedProxParams

    def begin(self, model: FedModel, global_state: GlobalState | None) -> None:
        super().begin(model, global_state)
        self._anchor = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}

    def after_backward(self, model: FedModel) -> None:
        mu = self.params.mu
        for name, p in model.named_parameters():
            if p.grad is not None and name in self._anchor:
                p.grad.add_(p.detach() - self._anchor[name], alpha=mu)


register_client(FedProxClient, summary="local SGD plus the proximal term mu/2 ||w - w_start||^2", payloads=("weights", "delta"))
