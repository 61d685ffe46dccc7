"""Admitting a site aggregator's roster at the root: is it the site's newest, and may each status it vouches for
be taken.

The intake has checked the site's signature. A roster is taken only if it is newer, by (``started_at``,
``seq``), than every roster taken from that site (``RosterOrder``): a replay changes nothing. Each status
it carries is then admitted as an agent's own would be (``admit_status``: its agent's (epoch, seq), the
registry's room, the task), with the site's signature standing in for the agent's: with enrollment
required, the agent must be enrolled here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.admission.decisions import Reject, StatusDecision
from coordinator.admission.statuses import admit_status
from coordinator.admission.view import AdmissionView
from coordinator.reasons import RejectReason
from protocol.messages import AgentStatus
from protocol.site_rosters import SiteRoster

RESYNC_EVERY_S = 5.0
"""The most often the root asks one site to resend statuses: the answer takes a roster interval or less."""


@dataclass
class RosterOrder:
    """Per site, the newest roster taken (``started_at``, ``seq``) and when the root last asked it to resync."""

    newest: dict[str, tuple[float, int]] = field(default_factory=dict)
    asked: dict[str, float] = field(default_factory=dict)
    site_of: dict[str, str] = field(default_factory=dict)
    """Agent -> the site whose roster vouched for it (a secure round serves it there); gone when it speaks to the
    root itself."""
    direct: set[str] = field(default_factory=set)
    """Agents heard from directly (their own signed status), not through a site."""

    def may_claim(self, agent_id: str, site: str, live: bool) -> bool:
        """Whether ``site``'s roster may vouch for ``agent_id``: unless it is held elsewhere (another site's, or
        the root's own) and still ``live`` there. An agent moves between sites only once its old place lost it."""
        holder = self.site_of.get(agent_id, "" if agent_id in self.direct else None)
        return holder is None or holder == site or not live

    def bind(self, agent_id: str, site: str) -> None:
        self.direct.discard(agent_id)
        self.site_of[agent_id] = site

    def speaks_directly(self, agent_id: str) -> None:
        self.site_of.pop(agent_id, None)
        self.direct.add(agent_id)

    def forget(self, agent_id: str) -> None:
        self.site_of.pop(agent_id, None)
        self.direct.discard(agent_id)

    def staleness(self, roster: SiteRoster) -> str | None:
        """Why ``roster`` is not newer than the last one taken from its site, or None. Reads only."""
        last = self.newest.get(roster.site_id)
        if last is None or (roster.started_at, roster.seq) > last:
            return None
        return (f"roster {roster.seq} of the process started at {roster.started_at:.3f}, newest taken: "
                f"{last[1]} of {last[0]:.3f}")

    def take(self, roster: SiteRoster) -> None:
        self.newest[roster.site_id] = (roster.started_at, roster.seq)

    def may_ask(self, site_id: str, now: float) -> bool:
        """Whether to send ``site_id`` a resync request now (and, if so, count it as sent)."""
        if now - self.asked.get(site_id, -RESYNC_EVERY_S) < RESYNC_EVERY_S:
            return False
        self.asked[site_id] = now
        return True


def admit_roster(roster: SiteRoster, order: RosterOrder) -> Reject | None:
    stale = order.staleness(roster)
    return None if stale is None else Reject(RejectReason.STALE_ROSTER, stale)


def admit_vouched_status(status: AgentStatus, site_id: str, view: AdmissionView) -> StatusDecision:
    """A status a site vouches for: as its agent's own, once the agent is known to be enrolled here."""
    if view.enrolled is not None and view.enrolled.get(status.agent_id) is None:
        return Reject(RejectReason.UNKNOWN_AGENT, f"{status.agent_id} (vouched for by site {site_id}) is not "
                                                  f"enrolled here")
    return admit_status(status, status.agent_id, None, view)
