"""Field types shared by the wire models: identifiers, digests, counters, the task reference.

A module of its own so that :mod:`protocol.task_card` and :mod:`protocol.messages` both build on
them without importing each other in a circle.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from protocol.version import SCHEMA_VERSION
from protocol.wire_model import WireModel

IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
"""Agent ids, federation and family names: safe inside an MQTT topic level (no / + #)."""

Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
NonNegativeInt = Annotated[int, Field(ge=0)]
Round = Annotated[int, Field(ge=0, le=10_000_000)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]

VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,31}$"
TaskVersion = Annotated[str, StringConstraints(pattern=VERSION_PATTERN)]

Epoch = Annotated[int, Field(ge=0, lt=2**63)]
"""A counter that only moves forward (freshness, docs/protocol.md): the coordinator's run epoch, an agent's
process epoch, a status sequence number. 0: a sender that predates freshness."""

MAX_AGENTS_PER_ROUND = 10_000
MAX_CLASSES = 100_000
"""The most classes a task's label space may declare (``TaskCard.classes``), and so ``label_counts`` may hold."""


class Message(WireModel):
    v: Literal[1] = SCHEMA_VERSION


class TaskRef(WireModel):
    """The user's task (model families, label space, data loader) a run trains, by name and version.

    Coordinator and agents must agree on it: an agent refuses a round of another task or version.
    """

    name: Identifier
    version: TaskVersion

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"
