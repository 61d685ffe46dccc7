"""A task as both sides and third parties see it: name, version, label space, and each family's layout.

The card travels: the coordinator publishes it, signed and retained, before round 1 (``TaskAnnouncement``),
so an agent written from ``docs/protocol.md`` alone learns what to train: which arrays, of which
shapes and dtypes, in which order, and the fingerprint that names that layout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from protocol.arrays import ArrayName
from protocol.fields import MAX_CLASSES, Digest, Identifier, TaskRef, TaskVersion
from protocol.wire_model import WireModel

ClassName = Annotated[str, StringConstraints(min_length=1, max_length=64)]
# Tuples are lax at their own level only (``strict=False`` on the field): msgpack and JSON carry them as
# arrays; their items stay strict.
WireDtype = Literal["<f2", "<f4", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1"]
"""numpy's dtype string as arrays travel (``protocol.limits.DEFAULT_DTYPES``): ``<f4`` float32, ``<i8`` int64."""


def layout_fingerprint(layout: Mapping[str, tuple[tuple[int, ...], str]]) -> str:
    """BLAKE2b (digest size 16) of a model's array names, dtypes and shapes, in order: equal models, equal prints.

    ``layout`` maps name -> (shape, dtype string), as ``protocol.arrays.layout_of`` gives it. The
    hashed text is ``name:dtype:shape;`` per array, shape written as a Python tuple (``(10,)``, ``(3, 4)``, ``()``).
    """
    h = hashlib.blake2b(digest_size=16)
    for name, (shape, dtype) in layout.items():
        h.update(f"{name}:{dtype}:{tuple(int(d) for d in shape)};".encode())
    return h.hexdigest()


class ArraySpec(WireModel):
    """One array of a model's state: what an agent's weights and deltas hold under this name."""

    name: ArrayName
    shape: tuple[Annotated[int, Field(ge=0, le=2**31, strict=True)], ...] = Field(max_length=8, strict=False)
    """At most 8 dimensions, as arrays travel (``DecodeLimits.max_ndim``)."""
    dtype: WireDtype


class FamilyLayout(WireModel):
    """A model family's layout: its fingerprint, and the arrays it covers when they are known."""

    fingerprint: Digest
    arrays: tuple[ArraySpec, ...] = Field(default=(), max_length=4096, strict=False)
    """In the order the fingerprint hashes them; empty when only the fingerprint is known (a card that
    does not declare the family's layout, pinned from what a majority of its agents announced)."""

    @model_validator(mode="after")
    def _check(self) -> FamilyLayout:
        if not self.arrays:
            return self
        names = [a.name for a in self.arrays]
        if len(set(names)) != len(names):
            raise PydanticCustomError("schema", "array names repeat")
        actual = layout_fingerprint(self.as_layout())
        if actual != self.fingerprint:
            raise PydanticCustomError("schema", "layout arrays have fingerprint {a}, not {f}",
                                      {"a": actual, "f": self.fingerprint})
        return self

    def as_layout(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {a.name: (tuple(a.shape), a.dtype) for a in self.arrays}

    @classmethod
    def of(cls, layout: Mapping[str, tuple[tuple[int, ...], str]]) -> FamilyLayout:
        return cls(fingerprint=layout_fingerprint(layout),
                   arrays=tuple(ArraySpec(name=n, shape=tuple(int(d) for d in s), dtype=d)
                                for n, (s, d) in layout.items()))


class TaskCard(WireModel):
    """A task as the coordinator, operators and third-party agents see it. Equal cards describe the same task."""

    name: Identifier
    version: TaskVersion
    kind: Literal["classification", "regression"] = "classification"
    classes: tuple[Annotated[ClassName, Field(strict=True)], ...] = Field(default=(), max_length=MAX_CLASSES,
                                                                         strict=False)
    """The declared label space, index = label; never inferred from one device's data."""
    families: tuple[Annotated[Identifier, Field(strict=True)], ...] = Field(min_length=1, max_length=64,
                                                                           strict=False)
    embedding_dim: int | None = Field(default=None, ge=1, le=65_536)
    """Every family's shared embedding width (FedProto's prototype space); None: no embedding."""
    description: str = Field(default="", max_length=500)
    layouts: dict[Identifier, FamilyLayout] = Field(default_factory=dict, max_length=64)
    """Each family's layout where the card declares it (``edge-agent tasks --card`` writes them all);
    a family absent here is fixed by a majority of its agents once a round's quorum is online."""

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
        unknown = sorted(set(self.layouts) - set(self.families))
        if unknown:
            raise PydanticCustomError("schema", "layouts of families the card does not declare: {u}",
                                      {"u": ", ".join(unknown)})
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

    def without_layouts(self) -> TaskCard:
        """The task itself: what two cards of one task agree on, whatever layouts each declares."""
        return self.model_copy(update={"layouts": {}})

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2) + "\n"
