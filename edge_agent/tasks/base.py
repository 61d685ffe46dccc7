"""The task contract: what a user writes so that the fleet trains their model on their devices' data.

A task names itself (name, version), declares its label space, gives a builder per model family,
a loader that turns a data-source string into a device's samples, and optionally its loss and
metrics. Built-in tasks are written against this same contract (``edge_agent/tasks/builtin``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from edge_agent.data.datasets import Dataset
from edge_agent.data.sources.report import LoadReport
from edge_agent.models import FedModel, seeded
from protocol.tasks import TaskCard

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(outputs, targets) -> a scalar, averaged over the batch (DP-SGD clips per sample around it)."""
MetricsFn = Callable[[torch.Tensor, torch.Tensor], Mapping[str, float]]
"""(outputs, targets) over a whole evaluation split -> named metrics; ``accuracy`` is reported as such."""


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    if len(targets) == 0:
        return {"accuracy": 0.0}
    return {"accuracy": (outputs.argmax(1) == targets).float().mean().item()}


@dataclass(frozen=True)
class Objective:
    """What local training minimises and what evaluation reports."""

    loss: LossFn = F.cross_entropy
    metrics: MetricsFn = accuracy


CLASSIFICATION = Objective()


@dataclass(frozen=True)
class DataContext:
    """What a task's loader is told besides the source string."""

    classes: tuple[str, ...]
    """The task's declared label space: label i is ``classes[i]``."""
    seed: int
    report: LoadReport = field(default_factory=LoadReport)
    """Where a loader records samples it dropped (corrupt files, bad rows) and warnings."""


DataLoader = Callable[[str, DataContext], Dataset]
ModelBuilder = Callable[[], nn.Module]


@dataclass(frozen=True)
class Task:
    """One federated learning problem, as every agent of a run must run it.

    ``families`` map a family name to a builder of a fresh model: a ``FedModel`` (features ending
    in ``embedding_dim``, then a head; needed for FedProto) or any ``nn.Module`` (run whole).
    ``device_families`` say which family each device profile runs by default (others: the first).
    """

    name: str
    version: str
    families: Mapping[str, ModelBuilder]
    load_data: DataLoader
    classes: Sequence[str] = ()
    kind: Literal["classification", "regression"] = "classification"
    embedding_dim: int | None = None
    device_families: Mapping[str, str] = field(default_factory=dict)
    default_data: str | None = None
    """The data source used when an agent is given none (built-in sets); None: it must be given."""
    loss: LossFn = F.cross_entropy
    metrics: MetricsFn = accuracy
    description: str = ""

    def __post_init__(self) -> None:
        try:
            card = TaskCard(name=self.name, version=self.version, kind=self.kind, classes=tuple(self.classes),
                            families=tuple(self.families), embedding_dim=self.embedding_dim,
                            description=self.description)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "task"
            raise ValueError(f"task {self.name!r}: {where}: {error['msg']}") from None
        for device, family in self.device_families.items():
            if family not in self.families:
                raise ValueError(f"task {self.name!r}: device_families[{device!r}] = {family!r} is not one of its "
                                 f"families ({', '.join(self.families)})")
        object.__setattr__(self, "card", card)

    card: TaskCard = field(init=False, repr=False, compare=False)

    @property
    def objective(self) -> Objective:
        return Objective(self.loss, self.metrics)

    @property
    def num_outputs(self) -> int:
        return len(self.classes)

    def family_for(self, device: str) -> str:
        return self.device_families.get(device, next(iter(self.families)))

    def build_model(self, family: str, seed: int) -> FedModel:
        """A fresh model of ``family`` with weights drawn from ``seed``: equal seeds, equal models."""
        if family not in self.families:
            raise ValueError(f"task {self.card.ref} has no model family {family!r}; its families: "
                             f"{', '.join(self.families)}")
        with seeded(seed):
            built = self.families[family]()
        if isinstance(built, FedModel):
            if built.embedding_dim != self.embedding_dim:
                raise ValueError(f"task {self.card.ref}: family {family!r} embeds into {built.embedding_dim} "
                                 f"dimensions, the task declares embedding_dim={self.embedding_dim}")
            return built
        if not isinstance(built, nn.Module):
            raise ValueError(f"task {self.card.ref}: family {family!r} built a {type(built).__name__}, "
                             f"not a torch.nn.Module")
        if self.embedding_dim is not None:
            raise ValueError(f"task {self.card.ref} declares embedding_dim={self.embedding_dim} but family "
                             f"{family!r} is a plain module: build it with FedModel.with_linear_head(features, "
                             f"{self.embedding_dim}, num_classes) so that its embedding can be reached")
        return FedModel.whole(built, self.num_outputs)

    def load(self, source: str, context: DataContext) -> Dataset:
        """The task's loader on ``source``, checked against the declared label space."""
        data = self.load_data(source, context)
        if not isinstance(data, Dataset):
            raise ValueError(f"task {self.card.ref}: load_data({source!r}) returned a {type(data).__name__}, "
                             f"not an edge_agent.data.Dataset")
        if data.num_classes != self.num_outputs:
            raise ValueError(f"task {self.card.ref}: data from {source!r} has {data.num_classes} classes, the task "
                             f"declares {self.num_outputs}")
        return data
