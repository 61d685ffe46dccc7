"""The broker connection both services configure the same way: where, who, TLS, and reconnect back-off.

``CoordinatorSettings`` and ``AgentSettings`` inherit these fields (each under its own environment
prefix), so a broker option means the same on both sides and is validated once.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from protocol.transport.address import MqttVersion, check_tls_contents
from protocol.transport.mqtt import BrokerAddress, tls_file_setting
from service_kit.startup import CannotStart


class BrokerSettings(BaseSettings):
    broker_url: str = Field(default="mqtt://localhost:1883", description=(
        "the MQTT broker: mqtt://host:port, or mqtts:// for TLS"))
    broker_username: str | None = Field(default=None, description="broker user name; unset: connect anonymously")
    broker_password: SecretStr | None = Field(default=None, description="broker password, with broker_username")
    ca_file: Path | None = Field(default=None, description=(
        "PEM file of the CA(s) that signed the broker's certificate (mqtts:// only); unset: the system's CAs"))
    cert_file: Path | None = Field(default=None, description=(
        "PEM client certificate, for brokers that authenticate clients by certificate (mqtts:// only; with key_file)"))
    key_file: Path | None = Field(default=None, description="PEM private key of cert_file (mqtts:// only)")
    mqtt_version: MqttVersion = Field(default="auto", description=(
        "MQTT version spoken to the broker: 5 (refused publishes and subscriptions are seen, e.g. an ACL's denial), "
        "3.1.1 (they cannot be seen), or auto: 5, and 3.1.1 if the broker answers 'unsupported protocol version'"))
    reconnect_min_s: float = Field(default=0.5, gt=0.0, le=60.0, description="first broker reconnect back-off")
    reconnect_max_s: float = Field(default=30.0, gt=0.0, le=3600.0, description="longest broker reconnect back-off")

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str) -> str:
        BrokerAddress.parse(value)
        return value

    _tls_file = field_validator("ca_file", "cert_file", "key_file")(tls_file_setting)

    @field_validator("mqtt_version", mode="before")
    @classmethod
    def _mqtt_version(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value  # YAML's 5

    @model_validator(mode="after")
    def _broker_consistent(self) -> BrokerSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: a client certificate needs its private key")
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError("reconnect_min_s cannot exceed reconnect_max_s")
        return self

    def check_tls_contents(self) -> None:
        """At start-up, before connecting: TLS files that OpenSSL cannot load stop the service naming them
        (CannotStart), not its first connection with a traceback. Not a field check: settings are also built
        and checked where the files are not at hand (the charts' tests render paths of mounted secrets)."""
        try:
            check_tls_contents(self.ca_file, self.cert_file, self.key_file)
        except ValueError as exc:
            raise CannotStart(str(exc)) from None

    def broker_address(self) -> BrokerAddress:
        password = self.broker_password.get_secret_value() if self.broker_password else None
        return BrokerAddress.parse(self.broker_url).with_credentials(self.broker_username, password).with_tls_files(
            self.ca_file, self.cert_file, self.key_file).with_mqtt_version(self.mqtt_version)
