"""A site aggregator's roster applied at the root: the statuses it vouches for, its agents kept live, and a
request for the statuses the root is missing.

Admission (``coordinator.admission.rosters``) decides; this records. Statuses go through the same path as
an agent's own (``applying.apply_status``: registry, label index, notices, metrics); ``present`` refreshes
the registry's ``last_seen`` of every agent the site still hears; ``gone`` forgets agents the site saw
decommissioned. Agents ``present`` names that the registry does not know (this coordinator restarted, or
forgot them while the site kept hearing them) are asked for with one ``SiteResync``, at most every
``RESYNC_EVERY_S`` per site.
"""

from __future__ import annotations

import logging

from coordinator.admission.decisions import Reject
from coordinator.admission.intake import RosterIn
from coordinator.admission.rosters import admit_roster, admit_vouched_status
from coordinator.reasons import RejectReason
from coordinator.round import applying
from coordinator.round.parts import EngineParts
from coordinator.round.run_state import RunState
from protocol.site_rosters import MAX_SITE_AGENTS, SiteResync
from protocol.wire import encode_message

log = logging.getLogger("coordinator.round.engine")


def apply_roster(parts: EngineParts, run: RunState, inbound: RosterIn) -> None:
    roster, site = inbound.roster, inbound.roster.site_id
    refusal = admit_roster(roster, parts.rosters)
    if refusal is not None:
        parts.rejects.record("site_roster", refusal.reason.value, site, refusal.detail)
        return
    parts.rosters.take(roster)
    now = parts.clock()
    view = applying.admission_view(parts, run, now)
    held: list[str] = []

    def claimable(agent_id: str) -> bool:
        record = parts.registry.get(agent_id)
        live = record is not None and record.heard_within(now, parts.settings.agent_timeout_s)
        if parts.rosters.may_claim(agent_id, site, live):
            return True
        held.append(agent_id)
        return False

    for status in roster.statuses:
        if not claimable(status.agent_id):
            continue
        decision = admit_vouched_status(status, site, view)
        applying.apply_status(parts, run, status.agent_id, status, decision, now)
        if not isinstance(decision, Reject):
            parts.rosters.bind(status.agent_id, site)
    for agent_id in roster.gone:
        if parts.rosters.may_claim(agent_id, site, live=True):  # a site forgets only its own (or unplaced) agents
            applying.forget(parts, agent_id)
            parts.rosters.forget(agent_id)
    present = [agent_id for agent_id in roster.present or () if claimable(agent_id)]
    if held:  # an agent may be both in statuses and in present: named once
        named = sorted(set(held))
        parts.rejects.record("site_roster", RejectReason.HELD_ELSEWHERE.value, site,
                             f"claims {len(named)} agents live elsewhere: {', '.join(named[:5])}")
    if roster.present is None:
        return
    unknown = parts.registry.touch(present, now)
    missing = set(unknown)
    for agent_id in present:  # only agents the registry holds: an id list alone must not grow the bindings
        if agent_id not in missing:
            parts.rosters.bind(agent_id, site)
    if unknown and parts.rosters.may_ask(site, now):
        everyone = len(unknown) == len(present)
        log.info("site %s: asking for the statuses of %s", site,
                 f"all its {len(unknown)} agents" if everyone else f"{len(unknown)} agents not known here")
        request = SiteResync(site_id=site, issued_at=parts.wall_clock(),
                             agents=None if everyone else unknown[:MAX_SITE_AGENTS])
        parts.publisher.publish(parts.topics.site_resync(site), parts.publisher.sealed(encode_message(request)),
                                "site_resync", retain=False)
