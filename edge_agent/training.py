"""Local training and evaluation on tensors already in memory (edge data sets are small)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from protocol.messages import LocalTraining

if TYPE_CHECKING:
    from edge_agent.algorithms.base import ClientAlgorithm


@dataclass(frozen=True)
class TrainResult:
    loss: float
    accuracy: float
    steps: int
    duration_s: float


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float
    samples: int


def to_tensors(data: Dataset, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(data.x).to(device), torch.from_numpy(data.y).to(device)


@torch.no_grad()
def evaluate(model: FedModel, data: Dataset, device: torch.device, batch_size: int = 1024) -> EvalResult:
    if len(data) == 0:
        return EvalResult(0.0, 0.0, 0)
    model.eval()
    x, y = to_tensors(data, device)
    loss_sum = 0.0
    correct = 0
    for start in range(0, len(y), batch_size):
        logits = model(x[start:start + batch_size])
        target = y[start:start + batch_size]
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct += (logits.argmax(1) == target).sum().item()
    return EvalResult(loss_sum / len(y), correct / len(y), len(y))


def train_local(model: FedModel, data: Dataset, plan: LocalTraining, batch_size: int, device: torch.device,
                algorithm: ClientAlgorithm, seed: int) -> TrainResult:
    """``plan.epochs`` passes of SGD over ``data``; the loss is cross-entropy plus the algorithm's terms."""
    started = time.perf_counter()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=plan.learning_rate, momentum=plan.momentum,
                                weight_decay=plan.weight_decay)
    x, y = to_tensors(data, device)
    generator = torch.Generator().manual_seed(seed)
    loss_sum = 0.0
    correct = seen = steps = 0
    for _ in range(plan.epochs):
        order = torch.randperm(len(y), generator=generator).to(device)
        for start in range(0, len(y), batch_size):
            index = order[start:start + batch_size]
            inputs, labels = x[index], y[index]
            embeddings = model.embed(inputs)
            logits = model.head(embeddings)
            loss = F.cross_entropy(logits, labels)
            extra = algorithm.extra_loss(model, embeddings, logits, labels)
            total = loss if extra is None else loss + extra
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            algorithm.after_backward(model)
            optimizer.step()
            steps += 1
            loss_sum += loss.item() * len(labels)
            correct += (logits.argmax(1) == labels).sum().item()
            seen += len(labels)
    return TrainResult(loss_sum / max(seen, 1), correct / max(seen, 1), steps, time.perf_counter() - started)
