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
    RoundAnnouncement,
    Signed,
    Update,
)
from protocol.wire import decode_message, encode_message

from .wire_strategies import (
    agent_statuses,
    assert_same_message,
    chunks,
    coordinator_statuses,
    global_states,
    round_announcements,
    sample_update,
    signed,
    updates,
)

ROUND_TRIP = settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])

STRATEGIES: dict[type[Message], st.SearchStrategy[Message]] = {
    CoordinatorStatus: coordinator_statuses,
    AgentStatus: agent_statuses,
    RoundAnnouncement: round_announcements(),
    GlobalState: global_states(),
    Update: updates(),
    Chunk: chunks(),
    Signed: signed(),
}


def round_trip(message: Message) -> Message:
    decoded = decode_message(encode_message(message), expect=type(message))
    assert_same_message(message, decoded)
    # Decoding without ``expect`` picks the same model from ``kind``.
    assert type(decode_message(encode_message(message))) is type(message)
    return decoded


def test_every_message_model_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(MESSAGE_TYPES.values())


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
