"""The bundled broker's queue, window, packet and memory sizes follow the fleet (docs/broker-sizing.md)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from protocol.transport.chunking import CHUNK_OVERHEAD_BYTES, split_payload
from tests.chart import FULLNAME, REPO, container, render

BROKER = f"{FULLNAME}-mosquitto"
MiB = 1024 * 1024
SIZING_KEYS = ("max_queued_messages", "max_queued_bytes", "max_inflight_messages", "max_packet_size")


def conf_settings(text: str) -> dict[str, str]:
    """The non-comment ``option value`` lines of a mosquitto.conf (the last one of an option wins)."""
    settings: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            option, _, value = line.partition(" ")
            settings[option] = value.strip()
    return settings


def broker_settings(values: dict[str, Any]) -> dict[str, str]:
    return conf_settings(render(values).get("ConfigMap", BROKER)["data"]["mosquitto.conf"])


def sizing(values: dict[str, Any]) -> dict[str, int]:
    settings = broker_settings(values)
    return {key: int(settings[key]) for key in SIZING_KEYS if key in settings}


def memory(values: dict[str, Any], name: str = "mosquitto") -> dict[str, Any]:
    resources = container(render(values).get("Deployment", BROKER), name)["resources"]
    return {"request": resources["requests"].get("memory"), "limit": resources["limits"].get("memory")}


def coordinator_limits(values: dict[str, Any]) -> dict[str, int]:
    config = yaml.safe_load(render(values).get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    return {key: config[key] for key in ("max_update_bytes", "max_message_bytes")}


def test_two_thousand_agents_with_small_updates() -> None:
    # Per agent and round: 1 update piece + ceil(60 s / 15 s) + 2 = 6 statuses; two rounds' worth.
    values = {"fleet": {"maxAgents": 2000, "maxUpdateBytes": 4096}}
    assert sizing(values) == {
        "max_queued_messages": 2000 * (1 + 6) * 2,
        "max_queued_bytes": 2000 * (4096 + 6 * 2048) * 2,
        "max_inflight_messages": 100,
        "max_packet_size": 4096 + 1024 + 65536,
    }
    # Far above the 1000 messages that lost 354 acknowledged updates at this fleet size.
    assert sizing(values)["max_queued_messages"] > 2000 * 2
    expected = 64 * MiB + 2000 * 64 * 1024 + 2000 * (4096 + 6 * 2048) * 2 + 100 * 4096
    mebibytes = -(-expected // MiB)
    assert memory(values) == {"request": f"{mebibytes}Mi", "limit": f"{mebibytes}Mi"}
    assert coordinator_limits(values) == {"max_update_bytes": 4096, "max_message_bytes": 0}


def test_chunked_updates_count_every_piece() -> None:
    # 64 MiB in 1 MiB chunks (up to 320 bytes of each are envelope): 65 pieces; 300 s rounds: 22 statuses.
    values = {"fleet": {"maxAgents": 10, "maxUpdateBytes": 64 * MiB, "maxMessageBytes": MiB, "headroomPercent": 50},
              "coordinator": {"config": {"round_deadline_s": 300}}}
    pieces = -(-64 * MiB // (MiB - CHUNK_OVERHEAD_BYTES))
    assert pieces == 65 == len(split_payload(bytes(64 * MiB), MiB))
    per_agent_bytes = pieces * MiB + 22 * 2048
    assert sizing(values) == {
        "max_queued_messages": -(-10 * (pieces + 22) * 150 // 100),
        "max_queued_bytes": -(-10 * per_agent_bytes * 150 // 100),
        "max_inflight_messages": 20,
        "max_packet_size": MiB + MiB // 4 + 65536,
    }
    assert coordinator_limits(values) == {"max_update_bytes": 64 * MiB, "max_message_bytes": MiB}


def test_the_queue_grows_with_the_fleet_and_the_round() -> None:
    small = sizing({"fleet": {"maxAgents": 100}})
    large = sizing({"fleet": {"maxAgents": 1000}})
    assert large["max_queued_messages"] == 10 * small["max_queued_messages"]
    assert large["max_queued_bytes"] == 10 * small["max_queued_bytes"]
    longer = sizing({"fleet": {"maxAgents": 100}, "coordinator": {"config": {"round_deadline_s": 600}}})
    assert longer["max_queued_messages"] == 100 * (1 + 40 + 2) * 2
    given = sizing({"fleet": {"maxAgents": 100, "statusesPerRound": 3, "headroomPercent": 0}})
    assert given["max_queued_messages"] == 100 * (1 + 3)


def test_limits_set_in_coordinator_config_size_the_broker_too() -> None:
    via_fleet = {"fleet": {"maxUpdateBytes": 8 * MiB, "maxMessageBytes": 65536}}
    via_config = {"coordinator": {"config": {"max_update_bytes": 8 * MiB, "max_message_bytes": 65536}}}
    assert sizing(via_fleet) == sizing(via_config)
    assert coordinator_limits(via_fleet) == coordinator_limits(via_config) == {
        "max_update_bytes": 8 * MiB, "max_message_bytes": 65536}


def test_every_derived_setting_can_be_overridden() -> None:
    values = {"mosquitto": {"maxQueuedMessages": 0, "maxQueuedBytes": 123456789, "maxInflightMessages": 7,
                            "maxPacketSize": 0}}
    assert sizing(values) == {"max_queued_messages": 0, "max_queued_bytes": 123456789, "max_inflight_messages": 7}
    assert sizing({"mosquitto": {"maxQueuedMessages": 1000, "maxPacketSize": 1048576}}) == {
        **sizing({}), "max_queued_messages": 1000, "max_packet_size": 1048576}
    # Memory follows an overridden queue byte limit...
    small = memory({"mosquitto": {"maxQueuedBytes": 0}})
    assert memory({"mosquitto": {"maxQueuedBytes": 1024}})["limit"] != small["limit"]
    # ...and is replaced by a memory the operator sets: one given, the other follows it.
    assert memory({"mosquitto": {"resources": {"limits": {"memory": "3Gi"}}}}) == {"request": "3Gi", "limit": "3Gi"}
    assert memory({"mosquitto": {"resources": {"requests": {"memory": "1Gi"}}}}) == {"request": "1Gi", "limit": "1Gi"}
    assert memory({"mosquitto": {"resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}}}) == {
        "request": "1Gi", "limit": "2Gi"}
    # The password init container is given the same resources.
    assert memory({}, "passwords") == memory({})


def test_memory_covers_every_queued_byte() -> None:
    for fleet in ({}, {"maxAgents": 2000, "maxUpdateBytes": 4096}, {"maxAgents": 300, "maxMessageBytes": 65536}):
        values = {"fleet": fleet}
        limit = memory(values)["limit"]
        assert limit.endswith("Mi")
        assert int(limit[:-2]) * MiB >= sizing(values)["max_queued_bytes"] + 64 * MiB


@pytest.mark.parametrize(("values", "message"), [
    ({"fleet": {"maxUpdateBytes": 300 * MiB}}, "set fleet.maxMessageBytes"),
    ({"fleet": {"maxMessageBytes": 100}}, "/fleet/maxMessageBytes"),
    ({"fleet": {"maxAgents": 0}}, "/fleet/maxAgents"),
    ({"mosquitto": {"maxQueuedMessages": -1}}, "/mosquitto/maxQueuedMessages"),
    ({"mosquitto": {"maxPacketSize": 10}}, "/mosquitto/maxPacketSize"),
])
def test_impossible_sizes_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception) as raised:
        render(values)
    assert message in str(raised.value), str(raised.value)


def test_large_unchunked_updates_are_fine_with_an_external_broker() -> None:
    values = {"fleet": {"maxUpdateBytes": 300 * MiB}, "mosquitto": {"enabled": False},
              "broker": {"url": "mqtt://broker.example:1883"}}
    assert coordinator_limits(values)["max_update_bytes"] == 300 * MiB


def test_the_standalone_config_matches_the_chart_defaults() -> None:
    """deploy/mosquitto/mosquitto.conf states the fleet it is sized for: the chart's defaults."""
    standalone = conf_settings((REPO / "deploy" / "mosquitto" / "mosquitto.conf").read_text())
    assert {key: int(standalone[key]) for key in SIZING_KEYS} == sizing({})


def test_the_queue_counts_every_piece_the_agents_really_send() -> None:
    """The chart's envelope room must be the code's: with less, chunked updates come in more pieces than the queue
    holds, and Mosquitto drops acknowledged QoS 1 pieces (found in review: 256 against 320)."""
    update, chunk = 4 * MiB, 4096
    values = {"fleet": {"maxAgents": 10, "maxUpdateBytes": update, "maxMessageBytes": chunk, "statusesPerRound": 1,
                        "headroomPercent": 0}}
    pieces = len(split_payload(bytes(update), chunk))
    assert sizing(values)["max_queued_messages"] == 10 * (pieces + 1)


def test_with_site_bridges_the_packet_limit_takes_a_full_site_roster() -> None:
    """A site sends up to 1,000 statuses in one roster; a packet limit sized from small updates alone cut the bridge
    at a site's first roster, and its persistent session sent the same packet again on every reconnect (found in
    review)."""
    from coordinator.admission.intake import roster_limits
    from protocol.site_rosters import SiteRoster
    from protocol.wire import encode_message
    from tests.unit.coordinator.test_fleet_bounds import status

    values = {"fleet": {"maxAgents": 2000, "maxUpdateBytes": 4096}, "mosquitto": {"sites": [{"id": "farm-1",
                                                                                               "password": "pw"}]}}
    packet = sizing(values)["max_packet_size"]
    assert packet >= roster_limits(10).max_payload_bytes + 1024  # the largest roster the coordinator takes
    ids = [f"rpi-{i:04d}" for i in range(1000)]
    roster = SiteRoster(site_id="farm-1", started_at=1.0, seq=1, statuses=[status(a) for a in ids], present=ids)
    assert len(encode_message(roster)) + 1024 <= packet
    assert sizing({"fleet": {"maxAgents": 2000, "maxUpdateBytes": 4096}})["max_packet_size"] < packet  # sites only
