"""Topic builders and their parser agree; anything else is BAD_TOPIC."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError, Reason
from protocol.topics import ParsedTopic, Topics, check_identifier

from .wire_strategies import MAX_ROUND, identifiers

FAST = settings(deadline=None, max_examples=60)

rounds = st.integers(min_value=0, max_value=MAX_ROUND)


def bad_topic(topics: Topics, topic: str) -> None:
    with pytest.raises(ProtocolError) as info:
        topics.parse(topic)
    assert info.value.reason is Reason.BAD_TOPIC


@FAST
@given(identifiers, identifiers, identifiers, rounds)
def test_builders_and_parse_round_trip(federation: str, agent: str, family: str, round_number: int) -> None:
    topics = Topics(federation)
    assert topics.parse(topics.coordinator_status) == ParsedTopic("coordinator_status")
    assert topics.parse(topics.rounds_current) == ParsedTopic("round")
    assert topics.parse(topics.agent_status(agent)) == ParsedTopic("agent_status", agent_id=agent)
    assert topics.parse(topics.update(agent, round_number)) == ParsedTopic("update", agent_id=agent, round=round_number)
    assert topics.parse(topics.global_state(family, round_number)) == ParsedTopic(
        "global_state", family=family, round=round_number
    )
    assert topics.parse(topics.global_state_chunk(family, round_number, 12)) == ParsedTopic(
        "global_state", family=family, round=round_number, chunk=12
    )
    assert topics.global_state_topics(family, round_number, 1) == [topics.global_state(family, round_number)]
    assert topics.global_state_topics(family, round_number, 2) == [
        topics.global_state_chunk(family, round_number, 0), topics.global_state_chunk(family, round_number, 1)]


def test_topic_names_follow_the_design() -> None:
    topics = Topics("fed-1")
    assert topics.coordinator_status == "fl/fed-1/coordinator/status"
    assert topics.rounds_current == "fl/fed-1/rounds/current"
    assert topics.global_state("cnn", 7) == "fl/fed-1/global/cnn/7"
    assert topics.global_states_of("cnn") == "fl/fed-1/global/cnn/#"
    assert topics.agent_status("jetson-3") == "fl/fed-1/agents/jetson-3/status"
    assert topics.all_agent_status == "fl/fed-1/agents/+/status"
    assert topics.update("jetson-3", 7) == "fl/fed-1/updates/jetson-3/7"
    assert topics.all_updates == "fl/fed-1/updates/+/+"
    assert topics.everything == "fl/fed-1/#"


@FAST
@given(identifiers, identifiers, identifiers, rounds)
def test_another_federations_topics_are_rejected(ours: str, theirs: str, agent: str, round_number: int) -> None:
    if ours == theirs:
        return
    mine, other = Topics(ours), Topics(theirs)
    for topic in (other.coordinator_status, other.rounds_current, other.agent_status(agent),
                  other.update(agent, round_number), other.global_state(agent, round_number)):
        bad_topic(mine, topic)


@FAST
@given(st.text(max_size=80))
def test_arbitrary_strings_parse_or_raise_bad_topic(topic: str) -> None:
    topics = Topics("fed")
    try:
        parsed = topics.parse(topic)
    except ProtocolError as exc:
        assert exc.reason is Reason.BAD_TOPIC
        return
    # Whatever parses must be exactly what a builder makes.
    rebuilt = {
        "coordinator_status": lambda p: topics.coordinator_status,
        "round": lambda p: topics.rounds_current,
        "agent_status": lambda p: topics.agent_status(p.agent_id),
        "update": lambda p: topics.update(p.agent_id, p.round),
        "global_state": lambda p: topics.global_state(p.family, p.round),
    }[parsed.kind](parsed)
    assert rebuilt == topic


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "fl",
        "fl/fed",
        "fl/fed/",
        "fl/fed/coordinator",
        "fl/fed/coordinator/status/extra",
        "fl/fed/rounds/previous",
        "/fl/fed/rounds/current",
        "fl/fed/rounds/current/",
        "FL/fed/rounds/current",
        "xx/fed/rounds/current",
        "fl/other/rounds/current",
        "fl/+/rounds/current",
        "fl/fed/agents/+/status",
        "fl/fed/agents/#",
        "fl/fed/agents/a/b/status",
        "fl/fed/agents//status",
        "fl/fed/agents/-lead/status",
        "fl/fed/agents/a b/status",
        "fl/fed/agents/" + "a" * 65 + "/status",
        "fl/fed/agents/a\n/status",
        "fl/fed/agents/a/state",
        "fl/fed/updates/a",
        "fl/fed/updates/a/+",
        "fl/fed/updates/a/-1",
        "fl/fed/updates/a/01",
        "fl/fed/updates/a/1.0",
        "fl/fed/updates/a/123456789",
        "fl/fed/updates/a/1\n",
        "fl/fed/updates/a\n/1",
        "fl/fed/updates/a/１",
        "fl/fed/updates/a/1/2",
        "fl/fed/global/cnn",
        "fl/fed/global/cnn/x",
        "fl/fed/global/cnn\n/3",
        "fl/fed/global/c/n/3",
        "fl/fed/global/cnn/3/x",
        "fl/fed/global/cnn/3/01",
        "fl/fed/global/cnn/3/123456",
        "fl/fed/global/cnn/3/0/1",
        "fl/fed/unknown/a/1",
    ],
)
def test_garbage_topics_are_bad_topic(topic: str) -> None:
    bad_topic(Topics("fed"), topic)


@pytest.mark.parametrize("name", ["", "-x", ".x", "_x", "a/b", "a+b", "a#", "a b", "a\n", "\na", "é", "a" * 65])
def test_bad_federation_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        Topics(name)
    with pytest.raises(ValueError):
        check_identifier(name, "agent id")


@FAST
@given(identifiers)
def test_valid_identifiers_are_accepted(name: str) -> None:
    assert check_identifier(name, "agent id") == name
    assert Topics(name).root == f"fl/{name}"
