"""Start-up checks of a task's model against its declaration and the device's data."""

from __future__ import annotations

import math

import torch

from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.tasks.base import Task
from edge_agent.weights import layout_of_model
from protocol.tasks import FamilyLayout, TaskCard, layout_fingerprint


def model_fingerprint(model: FedModel) -> str:
    """The layout fingerprint agents announce and compare (names, shapes, dtypes of the state)."""
    return layout_fingerprint(layout_of_model(model))


def full_card(task: Task) -> TaskCard:
    """``task``'s card with every family's layout (arrays and fingerprint), computed from its models: the card an
    operator hands to ``coordinator run --task card.json`` so that no agent's hello decides a layout."""
    layouts = {family: FamilyLayout.of(layout_of_model(task.build_model(family, seed=0))) for family in task.card.families}
    return task.card.model_copy(update={"layouts": layouts})


@torch.no_grad()
def check_model(task: Task, family: str, model: FedModel, sample: Dataset) -> None:
    """Run two of the device's samples through ``model``; ValueError names what does not fit.

    Catches at start what would otherwise fail in the first round: inputs the model cannot take,
    an embedding or output of another width than declared, a loss that is not a finite scalar.
    """
    what = f"task {task.card.ref}, family {family!r}"
    if len(sample) == 0:
        raise ValueError(f"{what}: the device has no samples to train on")
    x = torch.from_numpy(sample.x[:2])
    y = torch.from_numpy(sample.y[:2])
    was_training = model.training
    model.eval()
    try:
        try:
            z = model.embed(x)
            outputs = model.head(z)
        except Exception as exc:  # the user's forward pass: report it with the input it got
            raise ValueError(f"{what}: the model fails on inputs of shape {list(sample.x.shape[1:])} from the "
                             f"device's data: {type(exc).__name__}: {exc}") from exc
        if task.embedding_dim is not None and tuple(z.shape) != (len(x), task.embedding_dim):
            raise ValueError(f"{what}: embeddings are {list(z.shape[1:])}, the task declares embedding_dim="
                             f"{task.embedding_dim}")
        if task.kind == "classification" and tuple(outputs.shape) != (len(x), task.num_outputs):
            raise ValueError(f"{what}: outputs are {list(outputs.shape[1:])} per sample, the task declares "
                             f"{task.num_outputs} classes")
        loss = task.loss(outputs, y)
        if loss.ndim != 0 or not math.isfinite(loss.item()):
            raise ValueError(f"{what}: the loss must be a finite scalar (mean over the batch), got "
                             f"{list(loss.shape)} = {loss.detach().flatten()[:3].tolist()}")
    finally:
        model.train(was_training)
