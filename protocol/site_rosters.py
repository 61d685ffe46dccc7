"""A site's roster of its agents, up the bridge in place of their statuses; and the root's request to resend it.

Without it, every heartbeat of every agent at every site crossed a bridge and cost the root a signature
check: at 100,000 agents the root spent most of its CPU on statuses that said nothing new. A site
aggregator already verifies its agents' statuses; it sends the root a ``SiteRoster`` instead, signed by
the site's key, on ``sites/{site_id}/roster``: the statuses that changed since its last roster (anything
but ``timestamp`` and ``seq``), the agents it forgot, and, every ``roster_interval_s``, the ids of the
agents it heard from since its last such list (``present``), which keeps them live at the root. In a steady fleet a roster is
a list of ids: the root's cost per agent is a dictionary update, not a decode and a verification.

The root trusts a roster for what the site's signature proves: the site vouches for its agents'
statuses as it vouches for their outcomes in a partial. Each status keeps its agent's own (epoch,
seq), so a roster cannot make the root take an older status than one it heard. Rosters of a site are
ordered by (``started_at``, ``seq``): a replayed one is stale. A root that does not know an agent a
roster names present (it restarted, or forgot it) asks for its status with a ``SiteResync`` on
``sites/{site_id}/resync``, signed by the coordinator's key, down the bridge.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from protocol.agent_status import AgentStatus
from protocol.fields import Identifier, Message

MAX_ROSTER_STATUSES = 1_000
"""Statuses one roster carries; more changes go in several rosters in a row."""
MAX_SITE_AGENTS = 100_000
"""Ids one roster (``present``, ``gone``) or resync request may name."""


class SiteRoster(Message):
    """A site aggregator's agents: changed statuses, forgotten agents, and (periodically) who is present."""

    kind: Literal["site_roster"] = "site_roster"
    site_id: Identifier
    started_at: float
    """Wall time the site aggregator process started: with ``seq``, orders the site's rosters."""
    seq: int = Field(ge=1, lt=2**63)
    """Rosters of this process, counted from 1."""
    statuses: list[AgentStatus] = Field(default_factory=list, max_length=MAX_ROSTER_STATUSES)
    """Statuses of the site's agents that are new or changed since the previous roster, or that the root asked for,
    as the agents signed them (label counts included), checked by the site."""
    present: list[Identifier] | None = Field(default=None, max_length=MAX_SITE_AGENTS)
    """Every agent the site heard from (any admitted status) since its previous roster with a ``present`` list;
    None: this roster says nothing of liveness."""
    gone: list[Identifier] = Field(default_factory=list, max_length=MAX_SITE_AGENTS)
    """Agents the site forgot since its previous roster (a cleared retained status: decommissioned)."""

    @model_validator(mode="after")
    def _check(self) -> SiteRoster:
        named = [s.agent_id for s in self.statuses]
        if len(set(named)) != len(named):
            raise PydanticCustomError("schema", "a roster carries one status per agent")
        if self.present is not None and len(set(self.present)) != len(self.present):
            raise PydanticCustomError("schema", "present names each agent once")
        if self.gone and (set(self.gone) & (set(named) | set(self.present or ()))):
            raise PydanticCustomError("schema", "an agent is either gone or present, not both")
        return self


class SiteResync(Message):
    """The root asks a site to send the statuses of ``agents`` (None: of every agent it hears) in its next roster."""

    kind: Literal["site_resync"] = "site_resync"
    site_id: Identifier
    issued_at: float
    agents: list[Identifier] | None = Field(default=None, max_length=MAX_SITE_AGENTS)
