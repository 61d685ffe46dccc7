"""FedProto (Tan et al., 2022) on the agent: a personal model, aligned through prototypes.

The agent's model never leaves the device: it persists in the state directory (keyed by run
and family) from round to round and across restarts, and a new run starts from the seeded
initialisation. Each round it trains on

    cross-entropy + lambda * MSE(embedding(x), global_prototype[y])

over the samples whose class has a global prototype (none in round 1, nor for classes the
federation has not seen), then sends only its per-class mean embeddings and their counts.
Classes the agent lacks get a zero row with count 0.

It reports, on its held-out data, the accuracy of its own head (``head_accuracy``) and of
the nearest global prototype (``proto_accuracy``), and after training the distance between
its prototypes and the global ones (``proto_distance``), so a drifting agent stands out.
With ``normalize`` embeddings and prototypes are L2-normalised (nearest by cosine, then).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from edge_agent.algorithms.base import AlgorithmParams, ClientAlgorithm
from edge_agent.algorithms.registry import register_client
from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.prototypes import class_prototypes, embed_all, nearest_prototype, prototype_distance, unit_rows
from edge_agent.training import TrainResult
from edge_agent.weights import get_arrays, set_arrays
from protocol.arrays import all_finite
from protocol.errors import ProtocolError, Reason
from protocol.messages import GlobalState, LocalTraining

log = logging.getLogger(__name__)

FILE_PREFIX = "fedproto-"


def personal_model_name(run_id: str, family: str) -> str:
    """State-directory entry of an agent's personal model in run ``run_id``."""
    return f"{FILE_PREFIX}{run_id}-{family}"


class FedProtoParams(AlgorithmParams):
    lam: float = Field(alias="lambda", ge=0.0, le=1000.0)
    normalize: bool = False


class FedProtoClient(ClientAlgorithm):
    name = "fedproto"
    dp_compatible = True  # the alignment term is per-sample through the forward pass
    releases_prototypes = True
    params_model = FedProtoParams
    params: FedProtoParams

    @property
    def state_name(self) -> str:
        return personal_model_name(self.context.run_id, self.context.family)

    def load(self, model: FedModel, global_state: GlobalState | None) -> None:
        """The personal model (or the seeded init in a new run), and the global prototypes."""
        self.state.remove_matching(FILE_PREFIX, keep=self.state_name)  # earlier runs' models
        try:
            personal = self.state.read_arrays(self.state_name)
            if personal is not None and not all(all_finite(a) for a in personal.values() if a.dtype.kind == "f"
                                                and a.size):
                raise ValueError("it holds NaN or Inf")  # every round would fail on its loss
            if personal is not None:
                set_arrays(model, personal)
        except (ProtocolError, ValueError, TypeError) as exc:
            log.warning("personal model %s unusable (%s); starting again from the initialisation",
                        self.state_name, exc)
        self.global_prototypes: torch.Tensor | None = None
        self.global_counts: np.ndarray | None = None
        self.local: tuple[np.ndarray, np.ndarray] | None = None
        if global_state is None or global_state.prototypes is None or global_state.prototype_counts is None:
            return
        expected = (model.num_outputs, model.embedding_dim)
        if global_state.prototypes.shape != expected:
            raise ProtocolError(Reason.BAD_SHAPE, f"global prototypes are {list(global_state.prototypes.shape)}, "
                                                  f"this model needs {list(expected)}")
        self.global_counts = np.asarray(global_state.prototype_counts, dtype=np.int64)
        self.global_prototypes = torch.from_numpy(np.array(global_state.prototypes, dtype=np.float32)).to(
            self.context.device)
        self.known = torch.from_numpy(self.global_counts > 0).to(self.context.device)

    def begin(self, model: FedModel, global_state: GlobalState | None) -> None:
        pass  # the update holds prototypes, not weights: no delta to compute

    def extra_loss(self, model: FedModel, embeddings: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor | None:
        if self.params.lam == 0.0 or self.global_prototypes is None:
            return None
        aligned = self.known[labels]
        if not aligned.any():
            return None
        z = F.normalize(embeddings, dim=1) if self.params.normalize else embeddings
        # A mean over the whole batch, each record's term its own: a mean over the aligned records alone would
        # scale each one's gradient by how many others are aligned, and under DP-SGD one record would then move
        # the others' clipped gradients (the sensitivity the noise is calibrated to would not hold).
        per_record = (z - self.global_prototypes[labels]).pow(2).mean(dim=1) * aligned
        return self.params.lam * per_record.mean()

    def payload(self, model: FedModel, train: Dataset, result: TrainResult, plan: LocalTraining) -> dict[str, Any]:
        self._personal = get_arrays(model)
        embeddings, _ = embed_all(model, train, self.context.device, self.params.normalize)
        if self.prototype_release is not None:  # under DP: clipped, noised and accounted
            prototypes, counts = self.prototype_release.release(
                embeddings, torch.from_numpy(train.y), train.num_classes)
            if self.params.normalize:  # post-processing of the released means
                prototypes = unit_rows(prototypes)
        else:
            prototypes, counts = class_prototypes(embeddings, train.y, train.num_classes, self.params.normalize)
        self.local = (prototypes, counts)
        return {"prototypes": prototypes, "prototype_counts": counts}

    def commit(self) -> None:
        self.state.write_arrays(self.state_name, self._personal)

    def metrics(self, model: FedModel, held_out: Dataset) -> dict[str, float]:
        out: dict[str, float] = {}
        if len(held_out):
            embeddings, logits = embed_all(model, held_out, self.context.device, self.params.normalize)
            labels = torch.from_numpy(held_out.y).to(self.context.device)
            out["head_accuracy"] = (logits.argmax(1) == labels).float().mean().item()
            if self.global_prototypes is not None and bool(self.known.any()):
                predicted = nearest_prototype(embeddings, self.global_prototypes, self.known)
                out["proto_accuracy"] = (predicted == labels).float().mean().item()
        if self.local is not None and self.global_prototypes is not None and self.global_counts is not None:
            distance = prototype_distance(*self.local, self.global_prototypes.cpu().numpy(), self.global_counts)
            if distance is not None:
                out["proto_distance"] = distance
        return out


register_client(FedProtoClient, summary="a personal model aligned to the global prototypes; sends only prototypes", payloads=("prototypes",))
