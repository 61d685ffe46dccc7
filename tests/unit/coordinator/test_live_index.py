"""The registry's live set, kept by changes (coordinator/fleet/live.py), against a recount of every record."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.fleet.agents import AgentRecord, AgentRegistry, RegistryFull
from protocol.messages import AgentStatus, PrivacySpent
from tests.task_refs import DIGITS
from tests.unit.coordinator.test_engine import LAYOUT

TIMEOUT_S = 5.0
AGENTS = [f"a{i}" for i in range(8)]
EXHAUSTED = PrivacySpent(epsilon=3.0, delta=1e-5, exhausted=True)


def status(agent_id: str, state: str = "online", device: str = "rpi", denied: int = 0,
           exhausted: bool = False) -> AgentStatus:
    return AgentStatus(agent_id=agent_id, state=state, device=device, family="f", num_samples=1, num_eval_samples=1,
                       version="t", timestamp=0.0, task_ref=DIGITS, layout=LAYOUT, denied=denied,
                       privacy=EXHAUSTED if exhausted else None)


def recount(registry: AgentRegistry, now: float) -> dict[str, object]:
    """What the registry answered before it kept counts: a scan and a sort of every record."""
    records = [r for a in registry.agent_ids() if (r := registry.get(a)) is not None]
    live: list[AgentRecord] = sorted((r for r in records if r.heard_within(now, registry.timeout_s)),
                                     key=lambda r: r.agent_id)
    available = [r for r in live if r.can_train()]
    return {
        "available": [r.agent_id for r in available],
        "evaluable": [r.agent_id for r in live if r.status.state in ("online", "budget_exhausted")],
        "available_count": len(available),
        "evaluable_count": sum(1 for r in live if r.status.state in ("online", "budget_exhausted")),
        "spent": sum(1 for r in live if r.status.state == "budget_exhausted"),
        "online": dict(Counter(r.status.device for r in available)),
        "denied": dict(Counter(r.status.device for r in live if r.status.denied)),
    }


def answers(registry: AgentRegistry, now: float) -> dict[str, object]:
    return {
        "available": [r.agent_id for r in registry.available(now)],
        "evaluable": [r.agent_id for r in registry.evaluable(now)],
        "available_count": registry.available_count(now),
        "evaluable_count": registry.evaluable_count(now),
        "spent": registry.budget_spent_count(now),
        "online": dict(registry.online_by_device(now)),
        "denied": dict(registry.denied_by_device(now)),
    }


observe = st.tuples(st.just("observe"), st.sampled_from(AGENTS),
                    st.sampled_from(["online", "offline", "budget_exhausted"]), st.sampled_from(["rpi", "jetson"]),
                    st.sampled_from([0, 0, 2]), st.booleans())
spend = st.tuples(st.just("spend"), st.sampled_from(AGENTS))
forget = st.tuples(st.just("forget"), st.sampled_from(AGENTS))
silent = st.tuples(st.just("forget_silent"), st.sampled_from([3.0, 6.0, 12.0]))
ask = st.tuples(st.just("ask"))
# Mostly forward, by steps that cross the timeout and land exactly on it; now and then backwards.
step = st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5, 5.0, 7.0, -3.0])
events = st.lists(st.tuples(step, st.one_of(observe, observe, observe, spend, forget, silent, ask)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(events=events, capacity=st.sampled_from([3, 6, 50]))
def test_kept_counts_equal_a_recount_after_any_sequence(events: list[tuple[float, tuple]], capacity: int) -> None:
    registry = AgentRegistry(TIMEOUT_S, capacity=capacity)
    now = 100.0
    for dt, event in events:
        now += dt
        kind = event[0]
        if kind == "observe":
            _, agent_id, state, device, denied, exhausted = event
            try:
                registry.observe(status(agent_id, state, device, denied, exhausted), now)
            except RegistryFull:
                assert registry.refusal(agent_id, now) is not None
        elif kind == "spend":
            registry.budget_spent(event[1], EXHAUSTED)
        elif kind == "forget":
            registry.forget(event[1])
        elif kind == "forget_silent":
            registry.forget_silent(now, event[1])
        assert answers(registry, now) == recount(registry, now)
    # and asked again later, as the gauges are, after every record has had time to expire
    for later in (now + TIMEOUT_S / 2, now + TIMEOUT_S, now + TIMEOUT_S + 0.5):
        assert answers(registry, later) == recount(registry, later)


def test_a_heartbeat_of_a_live_agent_keeps_the_sorted_ids_and_expiry_drops_them() -> None:
    registry = AgentRegistry(TIMEOUT_S)
    for i, agent_id in enumerate(["c", "a", "b"]):
        registry.observe(status(agent_id, device="jetson" if i else "rpi"), 10.0 + i)
    assert [r.agent_id for r in registry.available(12.0)] == ["a", "b", "c"]
    registry.observe(status("c", denied=1), 14.0)  # c heard again: still live, now counted as denied
    assert registry.denied_by_device(14.0) == Counter({"rpi": 1})
    assert registry.online_by_device(15.0) == Counter({"rpi": 1, "jetson": 2})  # a heard at 11: 4s ago
    assert registry.online_by_device(16.0 + 1e-9) == Counter({"rpi": 1, "jetson": 1})  # a now silent past 5s
    assert [r.agent_id for r in registry.evaluable(19.0)] == ["c"]
    assert registry.online_by_device(19.0 + 1e-9) == Counter()
    assert registry.denied_by_device(19.0 + 1e-9) == Counter()


def test_the_expiry_queue_stays_as_short_as_the_timeouts_worth_of_statuses() -> None:
    """A site aggregator never asks for the gauges: statuses alone must not grow the queue without bound."""
    registry = AgentRegistry(TIMEOUT_S)
    for second in range(1_000):
        registry.observe(status(AGENTS[second % 4]), float(second))
    assert len(registry._index._expiry) <= TIMEOUT_S + 1
