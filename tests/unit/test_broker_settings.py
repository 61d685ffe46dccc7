"""One broker-settings model for both services: the same fields, rules and messages, each under its own prefix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from edge_agent.config import AgentSettings
from service_kit.broker import BrokerSettings


@pytest.mark.parametrize("settings", [CoordinatorSettings, AgentSettings])
def test_both_services_read_the_broker_the_same_way(settings: type[BrokerSettings], monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: object) -> None:
    assert issubclass(settings, BrokerSettings)
    assert set(BrokerSettings.model_fields) <= set(settings.model_fields)
    prefix = settings.model_config["env_prefix"]
    monkeypatch.setenv(f"{prefix}BROKER_URL", "mqtts://broker.example:8883")
    monkeypatch.setenv(f"{prefix}BROKER_USERNAME", "u")
    monkeypatch.setenv(f"{prefix}BROKER_PASSWORD", "p")
    address = settings().broker_address()
    assert (address.host, address.port, address.tls, address.username, address.password) == (
        "broker.example", 8883, True, "u", "p")
    with pytest.raises(ValidationError, match="reconnect_min_s cannot exceed reconnect_max_s"):
        settings(reconnect_min_s=10, reconnect_max_s=1)
    with pytest.raises(ValidationError, match="broker_url"):
        settings(broker_url="http://nope")
