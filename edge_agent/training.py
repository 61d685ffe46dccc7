"""Local training and evaluation on tensors already in memory (edge data sets are small)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.sgd import SGD
from edge_agent.tasks.base import CLASSIFICATION, Objective
from protocol.messages import LocalTraining


class TrainingHooks(Protocol):
    """What local training calls of an algorithm (``edge_agent.algorithms.base.ClientAlgorithm``
    provides it); typed structurally, since the algorithms import this module's results."""

    @property
    def absent_class_scale(self) -> float:
        """The factor on the logits of the classes this agent holds no sample of, in the training loss only."""

    def extra_loss(self, model: FedModel, embeddings: torch.Tensor, logits: torch.Tensor,
                   labels: torch.Tensor) -> torch.Tensor | None: ...

    def after_backward(self, model: FedModel) -> None: ...

    def after_step(self, model: FedModel) -> None: ...


@dataclass(frozen=True)
class TrainResult:
    loss: float
    accuracy: float
    steps: int
    duration_s: float


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float | None
    """The task's ``accuracy`` metric; None for a task that reports none (regression)."""
    samples: int
    metrics: dict[str, float]
    """Every metric the task reports, ``accuracy`` included."""


def to_tensors(data: Dataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(data.x).to(device), torch.from_numpy(data.y).to(device)


@torch.no_grad()
def evaluate(model: FedModel, data: Dataset, device: torch.device, objective: Objective = CLASSIFICATION,
             batch_size: int = 1024) -> EvalResult:
    """The objective's loss (averaged per sample) and its metrics over all of ``data``."""
    if len(data) == 0:
        return EvalResult(0.0, 0.0 if data.num_classes else None, 0, {})
    model.eval()
    x, y = to_tensors(data, device)
    loss_sum = 0.0
    outputs = []
    for start in range(0, len(y), batch_size):
        out = model(x[start:start + batch_size])
        loss_sum += objective.loss(out, y[start:start + batch_size]).item() * len(out)
        outputs.append(out)
    metrics = {k: float(v) for k, v in objective.metrics(torch.cat(outputs), y).items()}
    return EvalResult(loss_sum / len(y), metrics.get("accuracy"), len(y), metrics)


def batch_indices(num_samples: int, batch_size: int, plan: LocalTraining,
                  generator: torch.Generator) -> Iterator[torch.Tensor]:
    """The round's mini-batches as index tensors: ``plan.epochs`` reshuffled passes, or, when the plan
    sets ``steps``, passes until exactly that many batches (the last pass cut short)."""
    if num_samples == 0:
        return
    limit = plan.steps if plan.steps is not None else plan.epochs * math.ceil(num_samples / batch_size)
    taken = 0
    while taken < limit:
        order = torch.randperm(num_samples, generator=generator)
        for start in range(0, num_samples, batch_size):
            if taken == limit:
                return
            taken += 1
            yield order[start:start + batch_size]


def absent_class_factors(data: Dataset, scale: float, device: torch.device) -> torch.Tensor | None:
    """Per class, the factor on its logit in the training loss: 1 where ``data`` holds the class, ``scale`` where it
    holds none (a restricted softmax, as FedRS: Li and Zhan, KDD 2021); None when nothing is scaled.

    Under label skew an agent's cross-entropy pushes the logits of the classes it never sees down, every step;
    scaled down, they are pushed less, and the agent's update rewrites less of what the others taught the model."""
    if scale == 1.0 or not data.num_classes:
        return None
    held = torch.from_numpy(data.class_counts() > 0)
    return torch.where(held, 1.0, scale).to(device)


def train_local(model: FedModel, data: Dataset, plan: LocalTraining, batch_size: int, device: torch.device,
                algorithm: TrainingHooks, seed: int, objective: Objective = CLASSIFICATION) -> TrainResult:
    """SGD over ``data`` in the plan's batches (``batch_indices``); the loss is the task's plus the algorithm's terms."""
    started = time.perf_counter()
    model.train()
    optimizer = SGD(model.parameters(), lr=plan.learning_rate, momentum=plan.momentum,
                    weight_decay=plan.weight_decay)  # not torch.optim's: see edge_agent/sgd.py
    x, y = to_tensors(data, device)
    factors = absent_class_factors(data, algorithm.absent_class_scale, device)
    generator = torch.Generator().manual_seed(seed)
    loss_sum = 0.0
    correct = seen = steps = 0
    for index in batch_indices(len(y), batch_size, plan, generator):
        inputs, labels = x[index.to(device)], y[index.to(device)]
        embeddings = model.embed(inputs)
        logits = model.head(embeddings)
        loss = objective.loss(logits if factors is None else logits * factors, labels)
        extra = algorithm.extra_loss(model, embeddings, logits, labels)
        total = loss if extra is None else loss + extra
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        algorithm.after_backward(model)
        optimizer.step()
        algorithm.after_step(model)
        steps += 1
        loss_sum += loss.item() * len(labels)
        if data.num_classes:
            correct += (logits.argmax(1) == labels).sum().item()
        seen += len(labels)
    return TrainResult(loss_sum / max(seen, 1), correct / max(seen, 1), steps, time.perf_counter() - started)
