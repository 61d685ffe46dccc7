"""A family whose agents are all behind one site had no bound at the root in its first rounds: the root's own bound
is per family and it had no delta of it, and one site's mean is its own sites' median (found in review). The root's
deltas of its other families now bound it (``RoundNorms.fallback``), as they bound a direct family's lone delta."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from protocol.messages import AgentStatus
from protocol.partials import AgentOutcome
from protocol.site_rosters import SiteRoster
from protocol.wire import encode_message
from tests.task_refs import DIGITS, layout
from tests.unit.coordinator.test_engine import TOPICS, Clock, make_engine
from tests.unit.coordinator.test_site_plain_attacks import DIRECT, direct_deltas, model, partial, send_partial, update


def _status(agent_id: str, lay: str, family: str) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state="online", device="rpi", family=family, num_samples=10,
                       num_eval_samples=2, version="t", timestamp=1.0, task_ref=DIGITS, layout=lay, epoch=1, seq=1,
                       label_counts=np.array([9, 1] + [0] * 8, dtype=np.int64))


def test_a_lone_sites_family_is_not_bounded_by_the_relative_step(tmp_path: Path) -> None:
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path, clock, rounds=3, quorum_fraction=0.5)
    lay = layout(model(0.0))
    for agent_id in DIRECT:
        root.on_message(TOPICS.agent_status(agent_id), encode_message(_status(agent_id, lay, "f")))
    roster = SiteRoster(site_id="s1", started_at=1.0, seq=1, statuses=[_status("s1x", lay, "g")], present=["s1x"])
    root.on_message(TOPICS.site_roster("s1"), encode_message(roster))
    root.tick()
    assert root.open.number == 1
    for agent_id in DIRECT:
        root.on_message(TOPICS.update(agent_id, 1), encode_message(update(root, agent_id, 10, weights=model(1.0))))
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="accepted", samples=10, weight=10)},
                               family="g", base_digest=None, proposal=model(1.0)))
    root.tick(), root.tick()
    assert root.open.number == 2 and {"f", "g"} <= set(root.strategy.states), root.last_summary
    before = root.strategy.states["g"].weights["w"].copy()
    direct_deltas(root, 0.1)  # f: three honest deltas, relative step 0.1
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="accepted", samples=10, weight=10)},
                               family="g", base_digest=_digest(root, "g"),
                               sums={"w": np.full((2, 3), 10 * 1000.0), "b": np.full(3, 10 * 1000.0)},
                               heaviest="s1x"))
    root.tick()
    assert root.last_summary.round == 2 and root.last_summary.outcome == "completed", root.last_summary
    moved = float(np.max(np.abs(root.strategy.states["g"].weights["w"] - before)))
    assert moved <= 10.0, f"one site moved family g (no direct agents, first delta round) by {moved}"


def _digest(root, family):  # type: ignore[no-untyped-def]
    from protocol.messages import RoundAnnouncement
    from protocol.wire import decode_message
    ann = decode_message(root.outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    return ann.states[family].digest
