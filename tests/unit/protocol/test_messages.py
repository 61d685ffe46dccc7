"""Every message model survives encode_message/decode_message field for field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError, Reason
from protocol.messages import (
    MESSAGE_TYPES,
    AgentStatus,
    Chunk,
    CoordinatorStatus,
    GlobalState,
    Message,
    Notice,
    RoundAnnouncement,
    Signed,
    TaskAnnouncement,
    Update,
)
from protocol.partials import AgentOutcome, PartialAggregate
from protocol.secagg.wire import SecureSetup
from protocol.site_rosters import SiteResync, SiteRoster
from protocol.wire import decode_message, encode_message

from .secagg_strategies import SECAGG_STRATEGIES, secure_setups
from .wire_strategies import (
    agent_statuses,
    assert_same_message,
    chunks,
    coordinator_statuses,
    finite_floats,
    global_states,
    notices,
    round_announcements,
    sample_update,
    signed,
    task_announcements,
    updates,
)


@st.composite
def partials(draw: st.DrawFn) -> PartialAggregate:
    """A site's partial aggregate: float64 sums of the accepted agents' weighted deltas, every outcome."""
    weights = draw(st.lists(st.integers(1, 1000), min_size=0, max_size=4))
    outcomes = {f"a{i}": AgentOutcome(outcome="accepted", samples=w, weight=float(w)) for i, w in enumerate(weights)}
    outcomes["late"] = AgentOutcome(outcome="straggler")
    outcomes["bad"] = AgentOutcome(outcome="rejected", reason="stale_base")
    sums = {"w": np.full((2, 3), draw(st.floats(-1e6, 1e6)), dtype="<f8")} if weights else {}
    return PartialAggregate(run_id="r1", site_id="s1", round=draw(st.integers(0, 10_000_000)), family="f",
                            base_digest="0" * 32, sums=sums, heaviest="a0" if weights else None,
                            total_weight=float(sum(weights)), count=len(weights), outcomes=outcomes)


@st.composite
def site_rosters(draw: st.DrawFn) -> SiteRoster:
    """A site's roster: distinct agents' statuses, who it heard (or nothing of liveness), who is gone."""
    statuses = draw(st.lists(agent_statuses, max_size=3, unique_by=lambda s: s.agent_id))
    named = [s.agent_id for s in statuses]
    present = draw(st.none() | st.just(named + ["quiet-1"]))
    return SiteRoster(site_id="s1", started_at=draw(finite_floats), seq=draw(st.integers(1, 2**63 - 1)),
                      statuses=statuses, present=present, gone=["gone-1"] if draw(st.booleans()) else [])


site_resyncs = st.builds(SiteResync, site_id=st.just("s1"), issued_at=finite_floats,
                         agents=st.none() | st.lists(st.sampled_from(["a1", "a2", "b-3"]), max_size=3))


ROUND_TRIP = settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])

STRATEGIES: dict[type[Message], st.SearchStrategy[Message]] = {
    CoordinatorStatus: coordinator_statuses,
    AgentStatus: agent_statuses,
    RoundAnnouncement: round_announcements(),
    GlobalState: global_states(),
    Update: updates(),
    Chunk: chunks(),
    Signed: signed(),
    TaskAnnouncement: task_announcements(),
    Notice: notices,
    PartialAggregate: partials(),
    SiteRoster: site_rosters(),
    SiteResync: site_resyncs,
    **SECAGG_STRATEGIES,
}


def round_trip(message: Message) -> Message:
    decoded = decode_message(encode_message(message), expect=type(message))
    assert_same_message(message, decoded)
    # Decoding without ``expect`` picks the same model from ``kind``.
    assert type(decode_message(encode_message(message))) is type(message)
    return decoded


@ROUND_TRIP
@given(task_announcements())
def test_task_announcement_round_trips(message: TaskAnnouncement) -> None:
    decoded = round_trip(message)
    assert isinstance(decoded, TaskAnnouncement)
    assert decoded.card == message.card  # tuples travel as msgpack arrays and come back as tuples


@ROUND_TRIP
@given(notices)
def test_notice_round_trips(message: Notice) -> None:
    assert round_trip(message) == message


@ROUND_TRIP
@given(partials())
def test_partial_round_trips(message: PartialAggregate) -> None:
    assert_same_message(round_trip(message), message)


def test_every_message_model_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(MESSAGE_TYPES.values())


@ROUND_TRIP
@given(round_announcements(), secure_setups)
def test_a_secure_round_announcement_round_trips(announcement: RoundAnnouncement, setup: SecureSetup) -> None:
    round_trip(announcement.model_copy(update={"secure": setup}))


@ROUND_TRIP
@given(coordinator_statuses)
def test_coordinator_status_round_trips(message: CoordinatorStatus) -> None:
    round_trip(message)


@ROUND_TRIP
@given(agent_statuses)
def test_agent_status_round_trips(message: AgentStatus) -> None:
    decoded = round_trip(message)
    assert isinstance(decoded, AgentStatus)
    assert (decoded.privacy is None) == (message.privacy is None)
    assert (decoded.label_counts is None) == (message.label_counts is None)


@ROUND_TRIP
@given(round_announcements())
def test_round_announcement_round_trips(message: RoundAnnouncement) -> None:
    decoded = round_trip(message)
    assert isinstance(decoded, RoundAnnouncement)
    # bool, int and float hyper-parameters keep their types through the union
    assert [type(v) for v in decoded.params.values()] == [type(v) for v in message.params.values()]
    assert decoded.states.keys() == message.states.keys()


@ROUND_TRIP
@given(global_states())
def test_global_state_round_trips(message: GlobalState) -> None:
    decoded = round_trip(message)
    assert isinstance(decoded, GlobalState)
    assert decoded.digest == GlobalState.compute_digest(
        decoded.weights, decoded.control, decoded.prototypes, decoded.prototype_counts
    )


@ROUND_TRIP
@given(updates())
def test_update_round_trips(message: Update) -> None:
    decoded = round_trip(message)
    assert isinstance(decoded, Update)
    assert decoded.weights.keys() == message.weights.keys()
    assert decoded.delta.keys() == message.delta.keys()
    assert (decoded.prototypes is None) == (message.prototypes is None)


@ROUND_TRIP
@given(chunks())
def test_chunk_round_trips(message: Chunk) -> None:
    decoded = round_trip(message)
    assert isinstance(decoded, Chunk)
    assert type(decoded.data) is bytes


def test_big_endian_global_state_keeps_its_digest() -> None:
    weights = {"w": np.arange(6, dtype=">f4").reshape(2, 3), "n": np.array([1, 2], dtype=">i8")}
    message = GlobalState(run_id="run", family="cnn", round=1,
                          digest=GlobalState.compute_digest(weights, {}, None, None), weights=weights)
    decoded = round_trip(message)
    assert isinstance(decoded, GlobalState)
    assert decoded.weights["w"].dtype.str == "<f4"
    assert decoded.digest == message.digest


def test_messages_are_frozen() -> None:
    message = sample_update()
    with pytest.raises(ValueError):
        message.round = 4  # type: ignore[misc]


@ROUND_TRIP
@given(st.data())
def test_a_message_of_every_kind_is_refused_as_another(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(sorted(STRATEGIES, key=lambda c: c.__name__)))
    payload = encode_message(data.draw(STRATEGIES[cls]))
    for other in STRATEGIES:
        if other is cls:
            continue
        with pytest.raises(ProtocolError) as info:
            decode_message(payload, expect=other)
        assert info.value.reason is Reason.WRONG_KIND


def test_a_card_declares_only_layouts_arrays_can_travel_in() -> None:
    from pydantic import ValidationError

    from protocol.limits import DEFAULT_DTYPES
    from protocol.task_card import ArraySpec, WireDtype

    assert set(WireDtype.__args__) == DEFAULT_DTYPES  # type: ignore[attr-defined]
    for bad in ({"dtype": ">f4"}, {"dtype": "<f3"}, {"shape": (1,) * 9}):
        with pytest.raises(ValidationError):
            ArraySpec.model_validate({"name": "w", "shape": (2,), "dtype": "<f4", **bad})
