"""The link's reading of MQTT 5 acknowledgements: which reason codes are refusals, which topic
each one was about (paho reports only packet ids), logging the first of each kind, counting all."""

from __future__ import annotations

import logging

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from protocol.transport.acks import AckTracker, Denial, is_refusal


def puback(code: int) -> ReasonCode:
    return ReasonCode(PacketTypes.PUBACK, identifier=code)


def suback(code: int) -> ReasonCode:
    return ReasonCode(PacketTypes.SUBACK, identifier=code)


def tracker() -> tuple[AckTracker, list[Denial]]:
    denied: list[Denial] = []
    return AckTracker(denied.append, who="agent-a on mqtt://broker:1883"), denied


@pytest.mark.parametrize(("code", "refused"), [(0x00, False), (0x10, False), (0x80, True), (0x87, True),
                                               (0x90, True), (0x97, True)])
def test_reason_codes_from_0x80_are_refusals(code: int, refused: bool) -> None:
    # 0x10 "No matching subscribers" is what Mosquitto answers a publish nobody reads: a success.
    assert is_refusal(puback(code)) is refused


def test_a_refused_publish_names_its_topic_and_reason() -> None:
    acks, denied = tracker()
    acks.sent(1, "fl/f/agents/agent-a/status")
    acks.sent(2, "fl/f/updates/agent-a/3")
    acks.published(1, puback(0x10))
    acks.published(2, puback(0x87))
    assert denied == [Denial("publish", "fl/f/updates/agent-a/3", 0x87, "Not authorized")]
    assert str(denied[0]) == "publish to fl/f/updates/agent-a/3 refused: Not authorized (0x87)"
    assert acks.denials == 1


def test_an_acknowledgement_handled_before_the_publisher_noted_its_topic_is_not_lost() -> None:
    """The network thread may read the PUBACK before the publishing thread records the packet id."""
    acks, denied = tracker()
    acks.published(7, puback(0x87))
    acks.published(8, puback(0x00))
    assert denied == []
    acks.sent(7, "fl/f/updates/agent-a/1")
    acks.sent(8, "fl/f/agents/agent-a/status")
    assert [d.topic for d in denied] == ["fl/f/updates/agent-a/1"]
    acks.sent(8, "fl/f/agents/agent-a/status")  # packet id 8 used again: waits for its own answer
    acks.published(8, puback(0x87))
    assert [d.topic for d in denied] == ["fl/f/updates/agent-a/1", "fl/f/agents/agent-a/status"]


def test_a_refused_subscription_names_its_filter() -> None:
    acks, denied = tracker()
    acks.subscribing(1, "fl/f/rounds/current")
    acks.subscribing(2, "fl/f/global/mlp/#")
    acks.subscribed(1, [suback(0x01)])  # granted QoS 1
    acks.subscribed(2, [suback(0x87)])
    assert denied == [Denial("subscribe", "fl/f/global/mlp/#", 0x87, "Not authorized")]


def test_the_first_refusal_of_each_kind_is_logged_and_every_one_counted(caplog: pytest.LogCaptureFixture) -> None:
    acks, denied = tracker()
    with caplog.at_level(logging.ERROR, logger="protocol.transport.mqtt"):
        for mid in range(1, 6):
            acks.sent(mid, f"fl/f/updates/agent-a/{mid}")
            acks.published(mid, puback(0x87))
        acks.sent(6, "fl/f/updates/agent-a/6")
        acks.published(6, puback(0x97))
        acks.subscribing(7, "fl/f/rounds/current")
        acks.subscribed(7, [suback(0x87)])
    assert acks.denials == len(denied) == 7
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "agent-a on mqtt://broker:1883: publish to fl/f/updates/agent-a/1 refused: Not authorized (0x87); "
        "further publish refusals for this reason are only counted",
        "agent-a on mqtt://broker:1883: publish to fl/f/updates/agent-a/6 refused: Quota exceeded (0x97); "
        "further publish refusals for this reason are only counted",
        "agent-a on mqtt://broker:1883: subscribe to fl/f/rounds/current refused: Not authorized (0x87); "
        "further subscribe refusals for this reason are only counted",
    ]


def test_a_new_client_starts_packet_ids_over() -> None:
    acks, denied = tracker()
    acks.sent(1, "old/topic")
    acks.published(2, puback(0x87))  # answered early, never claimed by the old client
    acks.forget()
    acks.sent(2, "new/topic")  # the new client's packet 2 does not take the old client's answer
    acks.published(1, puback(0x00))
    assert denied == []
    acks.published(2, puback(0x87))
    assert [d.topic for d in denied] == ["new/topic"]
