"""Topic names, all under ``fl/{federation}/``.

Agent identity comes right after the kind, so a broker ACL can pin each agent to its own
topics: ``pattern write fl/<federation>/updates/%c/#`` and ``pattern write fl/<federation>/agents/%c/#``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from protocol.errors import ProtocolError, Reason
from protocol.messages import IDENTIFIER_PATTERN

_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)
_ROUND = re.compile(r"^(0|[1-9][0-9]{0,7})$")
_CHUNK_INDEX = re.compile(r"^(0|[1-9][0-9]{0,4})$")

TopicKind = Literal["coordinator_status", "round", "global_state", "agent_status", "update", "task", "notice",
                    "partial", "site_roster", "site_resync", "secagg", "secagg_relay", "secagg_inbox"]
SECAGG_STAGES = ("advertise", "shares", "masked", "reveal")
"""An agent's secure-aggregation stages (``protocol.secagg.wire``), the last level of its ``secagg`` topics."""
SECAGG_RELAYS = ("keys", "unmask")


def check_identifier(value: str, what: str) -> str:
    if not _IDENTIFIER.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be 1-64 of A-Z a-z 0-9 _ . - and start with a letter or digit")
    return value


@dataclass(frozen=True)
class ParsedTopic:
    kind: TopicKind
    agent_id: str | None = None
    """The sender an agent's topics name; on a partial's or roster's topic, its site's id (sites enroll like agents)."""
    family: str | None = None
    round: int | None = None
    chunk: int | None = None
    """A chunked global state's chunk topic: the index in its name."""
    stage: str | None = None
    """A secure-aggregation topic's stage (``SECAGG_STAGES`` or ``SECAGG_RELAYS``)."""


class Topics:
    def __init__(self, federation: str) -> None:
        self.federation = check_identifier(federation, "federation")
        self.root = f"fl/{federation}"

    @property
    def coordinator_status(self) -> str:
        return f"{self.root}/coordinator/status"

    @property
    def rounds_current(self) -> str:
        return f"{self.root}/rounds/current"

    @property
    def task(self) -> str:
        """The run's task card (``TaskAnnouncement``), retained."""
        return f"{self.root}/task"

    def notices(self, agent_id: str) -> str:
        """The coordinator's refusal notices to one agent (``Notice``), not retained."""
        return f"{self.root}/notices/{agent_id}"

    def global_state(self, family: str, round_number: int) -> str:
        return f"{self.root}/global/{family}/{round_number}"

    def global_state_chunk(self, family: str, round_number: int, index: int) -> str:
        """Where chunk ``index`` of a chunked global state is retained: one topic per chunk, since a
        broker retains only the last message of a topic and a late subscriber needs every chunk."""
        return f"{self.root}/global/{family}/{round_number}/{index}"

    def global_state_topics(self, family: str, round_number: int, chunks: int) -> list[str]:
        """The topics a state published in ``chunks`` pieces is retained on (1: unchunked)."""
        if chunks <= 1:
            return [self.global_state(family, round_number)]
        return [self.global_state_chunk(family, round_number, i) for i in range(chunks)]

    def global_states_of(self, family: str) -> str:
        return f"{self.root}/global/{family}/#"

    def agent_status(self, agent_id: str) -> str:
        return f"{self.root}/agents/{agent_id}/status"

    @property
    def all_agent_status(self) -> str:
        return f"{self.root}/agents/+/status"

    def update(self, agent_id: str, round_number: int) -> str:
        return f"{self.root}/updates/{agent_id}/{round_number}"

    @property
    def all_updates(self) -> str:
        return f"{self.root}/updates/+/+"

    def partial(self, site_id: str, round_number: int) -> str:
        """A site aggregator's partial aggregates of one round (``PartialAggregate``), up the site's bridge."""
        return f"{self.root}/sites/{site_id}/partials/{round_number}"

    @property
    def all_partials(self) -> str:
        return f"{self.root}/sites/+/partials/+"

    def site_roster(self, site_id: str) -> str:
        """A site aggregator's roster of its agents (``SiteRoster``), up the site's bridge in place of their statuses."""
        return f"{self.root}/sites/{site_id}/roster"

    @property
    def all_site_rosters(self) -> str:
        return f"{self.root}/sites/+/roster"

    def site_resync(self, site_id: str) -> str:
        """The root's request that a site resend some of its agents' statuses (``SiteResync``), down the bridge."""
        return f"{self.root}/sites/{site_id}/resync"

    def secagg(self, agent_id: str, round_number: int, stage: str) -> str:
        """An agent's message of one secure-aggregation stage (agent -> coordinator)."""
        return f"{self.root}/secagg/{agent_id}/{round_number}/{stage}"

    @property
    def all_secagg(self) -> str:
        return f"{self.root}/secagg/+/+/+"

    def secagg_relay(self, family: str, round_number: int, stage: str) -> str:
        """The coordinator's stage message to a family's secure roster (keys, unmask)."""
        return f"{self.root}/secagg_relay/{family}/{round_number}/{stage}"

    def secagg_relays_of(self, family: str) -> str:
        return f"{self.root}/secagg_relay/{family}/#"

    def secagg_inbox(self, agent_id: str, round_number: int) -> str:
        """The share bundles sealed for one agent, relayed by the coordinator."""
        return f"{self.root}/secagg_inbox/{agent_id}/{round_number}"

    def secagg_inbox_of(self, agent_id: str) -> str:
        return f"{self.root}/secagg_inbox/{agent_id}/#"

    @property
    def everything(self) -> str:
        return f"{self.root}/#"

    def parse(self, topic: str) -> ParsedTopic:
        """Classify a topic of this federation; raises BAD_TOPIC for anything else."""
        parts = topic.split("/")
        if len(parts) < 3 or parts[0] != "fl" or parts[1] != self.federation:
            raise ProtocolError(Reason.BAD_TOPIC, f"not a topic of federation {self.federation}: {topic[:120]}")
        rest = parts[2:]
        if rest == ["coordinator", "status"]:
            return ParsedTopic("coordinator_status")
        if rest == ["rounds", "current"]:
            return ParsedTopic("round")
        if rest == ["task"]:
            return ParsedTopic("task")
        if len(rest) == 2 and rest[0] == "notices" and _IDENTIFIER.fullmatch(rest[1]):
            return ParsedTopic("notice", agent_id=rest[1])
        if len(rest) == 3 and rest[0] == "agents" and rest[2] == "status" and _IDENTIFIER.fullmatch(rest[1]):
            return ParsedTopic("agent_status", agent_id=rest[1])
        if len(rest) == 3 and rest[0] == "updates" and _IDENTIFIER.fullmatch(rest[1]) and _ROUND.fullmatch(rest[2]):
            return ParsedTopic("update", agent_id=rest[1], round=int(rest[2]))
        if (len(rest) == 4 and rest[0] == "sites" and rest[2] == "partials" and _IDENTIFIER.fullmatch(rest[1])
                and _ROUND.fullmatch(rest[3])):
            return ParsedTopic("partial", agent_id=rest[1], round=int(rest[3]))
        if len(rest) == 3 and rest[0] == "sites" and rest[2] in ("roster", "resync") and _IDENTIFIER.fullmatch(rest[1]):
            return ParsedTopic("site_roster" if rest[2] == "roster" else "site_resync", agent_id=rest[1])
        if (len(rest) == 4 and rest[0] == "secagg" and _IDENTIFIER.fullmatch(rest[1]) and _ROUND.fullmatch(rest[2])
                and rest[3] in SECAGG_STAGES):
            return ParsedTopic("secagg", agent_id=rest[1], round=int(rest[2]), stage=rest[3])
        if (len(rest) == 4 and rest[0] == "secagg_relay" and _IDENTIFIER.fullmatch(rest[1])
                and _ROUND.fullmatch(rest[2]) and rest[3] in SECAGG_RELAYS):
            return ParsedTopic("secagg_relay", family=rest[1], round=int(rest[2]), stage=rest[3])
        if len(rest) == 3 and rest[0] == "secagg_inbox" and _IDENTIFIER.fullmatch(rest[1]) and _ROUND.fullmatch(rest[2]):
            return ParsedTopic("secagg_inbox", agent_id=rest[1], round=int(rest[2]), stage="inbox")
        if (len(rest) in (3, 4) and rest[0] == "global" and _IDENTIFIER.fullmatch(rest[1]) and _ROUND.fullmatch(rest[2])
                and (len(rest) == 3 or _CHUNK_INDEX.fullmatch(rest[3]))):
            return ParsedTopic("global_state", family=rest[1], round=int(rest[2]),
                               chunk=int(rest[3]) if len(rest) == 4 else None)
        raise ProtocolError(Reason.BAD_TOPIC, f"unknown topic {topic[:120]}")
