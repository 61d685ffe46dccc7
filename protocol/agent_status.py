"""An agent's status: its retained hello, heartbeat and last will (``fl/{F}/agents/{id}/status``).

A module of its own, on :mod:`protocol.fields` and :mod:`protocol.arrays`, so that a site's roster
(:mod:`protocol.site_rosters`), which carries its agents' statuses up the bridge, and
:mod:`protocol.messages`, which lists both among the message types, import it without a cycle.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from protocol.arrays import Array
from protocol.fields import MAX_CLASSES, Digest, Epoch, Identifier, Message, NonNegativeInt, TaskRef
from protocol.wire_model import WireModel


class PrivacySpent(WireModel):
    epsilon: float = Field(ge=0.0)
    delta: float = Field(ge=0.0, lt=1.0)
    budget_epsilon: float | None = Field(default=None, gt=0.0)
    exhausted: bool = False


class AgentStatus(Message):
    """Retained hello and heartbeat; the agent's last will republishes it offline."""

    kind: Literal["agent_status"] = "agent_status"
    agent_id: Identifier
    state: Literal["online", "offline", "budget_exhausted"]
    device: Identifier
    family: Identifier
    num_samples: NonNegativeInt
    num_eval_samples: NonNegativeInt
    version: str = Field(max_length=64)
    timestamp: float
    privacy: PrivacySpent | None = None
    session: Identifier | None = None
    """New on every agent process start, so the coordinator can tell restarts from reconnects."""
    reconnects: NonNegativeInt = 0
    """Broker reconnections of this agent process so far."""
    rejected: NonNegativeInt = 0
    """Messages this agent process dropped (unsigned, forged, inconsistent or malformed) so far."""
    denied: NonNegativeInt = 0
    """Publishes and subscriptions of this agent process the broker refused so far (MQTT 5 reason code
    0x80 or above, e.g. 0x87 not authorized; always 0 over MQTT 3.1.1, which cannot tell)."""
    task_ref: TaskRef
    """The task this agent runs."""
    layout: Digest
    """Fingerprint of its model family's layout (``protocol.tasks.layout_fingerprint``)."""
    problem: str | None = Field(default=None, max_length=512)
    """Why it refuses rounds, when it does (e.g. a task or layout mismatch); None when it does not."""
    label_counts: Array | None = None
    """Its training samples per class, in the task's label space (index = label, length = the task's
    classes), summing to ``num_samples``: what heterogeneity-aware weighting compares with the
    federation's label distribution. None for regression tasks and for agents under DP (a histogram
    of the raw training records is not covered by DP-SGD, so a DP agent leaves it out)."""
    epoch: Epoch = 0
    """This agent process's epoch: higher at every process start (kept in its state directory)."""
    seq: Epoch = 0
    """Statuses of this process, counted from 1; 0 is its last will. (epoch, seq) orders an agent's statuses."""
    notice: str | None = Field(default=None, max_length=600)
    """The coordinator's latest refusal notice to this agent (``reason: detail``), None when it got none."""

    @model_validator(mode="after")
    def _check(self) -> AgentStatus:
        counts = self.label_counts
        if counts is None:
            return self
        if counts.ndim != 1 or counts.dtype.kind not in "iu" or not 1 <= counts.size <= MAX_CLASSES:
            raise PydanticCustomError("bad_shape", "label_counts must be a 1-D integer array of 1 to {m} classes",
                                      {"m": MAX_CLASSES})
        if (counts < 0).any():
            raise PydanticCustomError("schema", "label_counts must be non-negative")
        # Exact: int64 cannot wrap around below this bound; crafted counts above it are summed in Python's ints.
        total = (int(counts.sum(dtype=np.int64)) if int(counts.max()) * counts.size < 2**63
                 else sum(counts.tolist()))
        if total != self.num_samples:
            raise PydanticCustomError("schema", "label_counts sum to {t}, num_samples is {n}",
                                      {"t": total, "n": self.num_samples})
        return self
