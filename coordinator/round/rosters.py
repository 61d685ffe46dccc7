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

from coordinator.admission.intake import RosterIn
from coordinator.admission.rosters import admit_roster, admit_vouched_status
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
    for status in roster.statuses:
        applying.apply_status(parts, run, status.agent_id, status, admit_vouched_status(status, site, view), now)
        parts.rosters.site_of[status.agent_id] = site
    for agent_id in roster.gone:
        applying.forget(parts, agent_id)
        parts.rosters.site_of.pop(agent_id, None)
    if roster.present is None:
        return
    parts.rosters.site_of.update((agent_id, site) for agent_id in roster.present)
    unknown = parts.registry.touch(roster.present, now)
    if unknown and parts.rosters.may_ask(site, now):
        everyone = len(unknown) == len(roster.present)
        log.info("site %s: asking for the statuses of %s", site,
                 f"all its {len(unknown)} agents" if everyone else f"{len(unknown)} agents not known here")
        request = SiteResync(site_id=site, issued_at=parts.wall_clock(),
                             agents=None if everyone else unknown[:MAX_SITE_AGENTS])
        parts.publisher.publish(parts.topics.site_resync(site), parts.publisher.sealed(encode_message(request)),
                                "site_resync", retain=False)
