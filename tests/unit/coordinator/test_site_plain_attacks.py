"""A lying site aggregator's plain partial at the root: it names only its own agents, its mean is bounded like the
deltas the root clips, its integer arrays fit the state, and an honest site's weightless agents fail nothing.

The root has its default bounds (claim cap 1x the median claim, norm clip 1x the median norm), three direct
agents and two sites of one agent each, bound to them by roster. Round 1 bootstraps; round 2 is a delta round."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from coordinator.app.driver import EngineDriver
from coordinator.telemetry.metrics import CoordinatorMetrics
from protocol.messages import AgentStatus, RoundAnnouncement, TrainMetrics, Update
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.site_rosters import SiteRoster
from protocol.wire import decode_message, encode_message
from tests.task_refs import DIGITS, layout
from tests.unit.coordinator.test_engine import TOPICS, Clock, Outbox, make_engine, rejected


def model(value: float, with_int: bool = False) -> dict[str, np.ndarray]:
    out = {"w": np.full((2, 3), value, np.float32), "b": np.full(3, value, np.float32)}
    if with_int:
        out["n"] = np.zeros(2, np.int64)
    return out


DIRECT = ["a", "b", "c"]
SITE_AGENTS = {"s1": ["s1x"], "s2": ["s2x"]}


def status(agent_id: str, lay: str, samples: int = 10) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state="online", device="rpi", family="f", num_samples=samples,
                       num_eval_samples=2, version="t", timestamp=1.0, task_ref=DIGITS, layout=lay, epoch=1, seq=1,
                       label_counts=np.array([samples - 1, 1] + [0] * 8, dtype=np.int64))


def update(root: EngineDriver, agent_id: str, samples: int, **payload: object) -> Update:
    ann = decode_message(root.outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    ref = ann.states.get("f")
    return Update(run_id=root.run.run_id, agent_id=agent_id, round=ann.round, task=ann.task, task_ref=DIGITS,
                  family="f", base_digest=ref.digest if ref else None, num_samples=samples,
                  metrics=TrainMetrics(eval_loss=1.0, eval_accuracy=0.5, num_eval_samples=2), **payload)


def partial(root: EngineDriver, site: str, outcomes: dict[str, AgentOutcome], **fields: object) -> PartialAggregate:
    ann = decode_message(root.outbox.last(TOPICS.rounds_current), RoundAnnouncement)
    ref = ann.states.get("f")
    accepted = [o for o in outcomes.values() if o.outcome == "accepted" and o.weight > 0]
    base = dict(run_id=root.run.run_id, site_id=site, round=ann.round, family="f",
                base_digest=ref.digest if ref else None, total_weight=sum(o.weight for o in accepted),
                count=len(accepted), outcomes=outcomes)
    base.update(fields)
    return PartialAggregate(**base)


def send_partial(root: EngineDriver, p: PartialAggregate) -> None:
    root.on_message(TOPICS.partial(p.site_id, p.round), encode_message(p))


def federation(tmp_path: Path, with_int: bool = False) -> tuple[EngineDriver, Outbox, CoordinatorMetrics, Clock]:
    """Root (default bounds: claim_cap_multiple 1, max_norm_ratio 1); 3 direct agents; s1 and s2 with one agent
    each (bound by rosters). Round 1 bootstraps; returns with round 2 (a delta round) open."""
    clock = Clock()
    root, outbox, metrics = make_engine(tmp_path, clock, rounds=3, quorum_fraction=0.5)
    lay = layout(model(0.0, with_int))
    for agent_id in DIRECT:
        root.on_message(TOPICS.agent_status(agent_id), encode_message(status(agent_id, lay)))
    for site, agents in SITE_AGENTS.items():
        roster = SiteRoster(site_id=site, started_at=1.0, seq=1, statuses=[status(a, lay) for a in agents],
                            present=list(agents))
        root.on_message(TOPICS.site_roster(site), encode_message(roster))
    assert root.engine.parts.rosters.site_of == {"s1x": "s1", "s2x": "s2"}
    root.tick()
    assert root.open.number == 1 and set(root.open.selected) == {"a", "b", "c", "s1x", "s2x"}
    for agent_id in DIRECT:
        msg = update(root, agent_id, 10, weights=model(1.0, with_int))
        root.on_message(TOPICS.update(agent_id, 1), encode_message(msg))
    for site, agents in SITE_AGENTS.items():
        send_partial(root, partial(root, site, {a: AgentOutcome(outcome="straggler") for a in agents}))
    root.tick()
    assert root.last_summary.outcome == "completed", root.last_summary
    root.tick()
    assert root.open.number == 2 and "f" in root.strategy.states
    return root, outbox, metrics, clock


def direct_deltas(root: EngineDriver, value: float = 0.1, with_int: bool = False, samples: int = 10) -> None:
    for agent_id in DIRECT:
        delta = model(value, with_int)
        msg = update(root, agent_id, samples, delta=delta)
        root.on_message(TOPICS.update(agent_id, 2), encode_message(msg))


def state_w(root: EngineDriver) -> np.ndarray:
    return root.strategy.states["f"].weights["w"]


def close_after_the_deadline(root: EngineDriver, clock: Clock) -> None:
    """A refused partial leaves its site's agent unaccounted for: the round closes at its deadline."""
    clock.now += 11.0
    root.tick()
    assert root.last_summary.round == 2 and root.last_summary.outcome == "completed", root.last_summary


def test_a_site_cannot_claim_a_direct_agent(tmp_path: Path) -> None:
    root, _, metrics, _ = federation(tmp_path)
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="straggler"),
                                            "a": AgentOutcome(outcome="rejected", reason="bad_shape")}))
    assert rejected(metrics, "held_elsewhere", "partial") == 1
    assert "a" not in root.open.settled and "s1x" not in root.open.settled  # refused whole: a may still answer


def test_a_site_cannot_claim_another_sites_agent_and_void_that_sites_partial(tmp_path: Path) -> None:
    root, _, metrics, _ = federation(tmp_path)
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="straggler"),
                                            "s2x": AgentOutcome(outcome="straggler")}))
    assert rejected(metrics, "held_elsewhere", "partial") == 1
    honest = partial(root, "s2", {"s2x": AgentOutcome(outcome="accepted", samples=10, weight=10)},
                     sums={"w": np.full((2, 3), 1.0), "b": np.full(3, 1.0)}, heaviest="s2x")
    send_partial(root, honest)
    assert "s2x" in root.open.updates


def test_a_sites_mean_delta_is_clipped_like_a_delta_sent_to_the_root(tmp_path: Path) -> None:
    """Three direct deltas of norm 0.3 (0.1 in each of 9 values) set the clip bound: one site's mean of norm 3e6 is
    clipped to it, as one agent's delta would be; a shorter one is folded as it is."""
    root, _, metrics, _ = federation(tmp_path)
    direct_deltas(root, 0.1)
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="accepted", samples=10, weight=10)},
                               sums={"w": np.full((2, 3), 10 * 1e6), "b": np.full(3, 10 * 1e6)}, heaviest="s1x"))
    send_partial(root, partial(root, "s2", {"s2x": AgentOutcome(outcome="accepted", samples=10, weight=10)},
                               sums={"w": np.full((2, 3), 10 * 0.05), "b": np.full(3, 10 * 0.05)}, heaviest="s2x"))
    root.tick()
    assert root.last_summary.round == 2 and root.last_summary.outcome == "completed", root.last_summary
    assert root.last_summary.clipped_norms == ["s1"] and rejected(metrics, "bad_partial", "partial") == 0
    np.testing.assert_allclose(state_w(root), 1.0 + (4 * 10 * 0.1 + 10 * 0.05) / 50, rtol=1e-6)


@pytest.mark.parametrize("integers", [np.zeros(3, np.int64), np.zeros((4, 2), np.int64), np.zeros(2, np.int32)],
                         ids=["wrong-length", "wrong-shape", "wrong-dtype"])
def test_a_sites_integer_arrays_must_be_the_states_not_a_crash_or_a_reshape(tmp_path: Path,
                                                                              integers: np.ndarray) -> None:
    """The heaviest agent's integer arrays are taken as they are: here the site's agent outweighs the direct ones."""
    root, _, metrics, clock = federation(tmp_path, with_int=True)
    direct_deltas(root, 0.1, with_int=True, samples=5)
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="accepted", samples=10, weight=10)},
                               sums={"w": np.full((2, 3), 1.0), "b": np.full(3, 1.0)},
                               integers={"n": integers}, heaviest="s1x"))
    assert rejected(metrics, "bad_partial", "partial") == 1
    send_partial(root, partial(root, "s2", {"s2x": AgentOutcome(outcome="straggler")}))
    close_after_the_deadline(root, clock)
    assert root.strategy.states["f"].weights["n"].shape == (2,)
    assert root.strategy.states["f"].weights["n"].dtype == np.int64


def test_an_accepted_agent_of_weight_0_fails_no_round(tmp_path: Path) -> None:
    """An honest site may accept an agent that reported 0 samples: alone (no sums), or beside one of weight."""
    root, _, metrics, _ = federation(tmp_path)
    direct_deltas(root, 0.1)
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="accepted", samples=0, weight=0.0)}))
    send_partial(root, partial(root, "s2", {"s2x": AgentOutcome(outcome="straggler")}))
    root.tick()
    assert root.last_summary.round == 2 and root.last_summary.outcome == "completed", root.last_summary
    np.testing.assert_allclose(state_w(root), 1.1, rtol=1e-6)


def test_a_site_counts_its_agents_for_no_more_than_the_cap_the_round_announced(tmp_path: Path) -> None:
    """The root cannot re-weigh a site's sum: the round announces its median-based cap (1x the median claim of
    10), a partial that counts an agent for more is refused whole, one that caps it as announced is folded."""
    root, _, metrics, _ = federation(tmp_path)
    assert decode_message(root.outbox.last(TOPICS.rounds_current), RoundAnnouncement).claim_cap == 10
    direct_deltas(root, 0.0)
    send_partial(root, partial(root, "s1", {"s1x": AgentOutcome(outcome="accepted", samples=1000, weight=1000)},
                               sums={"w": np.full((2, 3), 1000 * 0.1), "b": np.full(3, 1000 * 0.1)}, heaviest="s1x"))
    assert rejected(metrics, "bad_partial", "partial") == 1 and "s1x" not in root.open.updates
    send_partial(root, partial(root, "s2", {"s2x": AgentOutcome(outcome="accepted", samples=1000, weight=10)},
                               sums={"w": np.full((2, 3), 10 * 0.0), "b": np.full(3, 10 * 0.0)}, heaviest="s2x"))
    assert rejected(metrics, "bad_partial", "partial") == 1 and "s2x" in root.open.updates
