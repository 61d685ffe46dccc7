"""ca_file, cert_file and key_file: checked at start-up by both services, carried into the MQTT session."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from coordinator.app.cli import app as coordinator_app
from coordinator.settings import CoordinatorSettings
from edge_agent.cli import app as agent_app
from edge_agent.config import AgentSettings
from protocol.transport.mqtt import BrokerAddress, MqttLink
from service_kit.settings import ConfigError, load_settings
from tests.tls import Issued, TestCA

SETTINGS = [CoordinatorSettings, AgentSettings]
IDS = ["coordinator", "agent"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestCA, Issued]:
    ca = TestCA(tmp_path_factory.mktemp("pki"))
    return ca, ca.client("agent-a")


@pytest.mark.parametrize("cls", SETTINGS, ids=IDS)
def test_tls_files_reach_the_broker_address(cls: type[BaseSettings], pki: tuple[TestCA, Issued]) -> None:
    ca, client = pki
    settings = load_settings(cls, overrides={"broker_url": "mqtts://broker.example:8883", "ca_file": str(ca.cert_file),
                                             "cert_file": str(client.cert_file), "key_file": str(client.key_file)})
    address = settings.broker_address()  # type: ignore[attr-defined]
    assert (address.tls, address.ca_file, address.cert_file, address.key_file) == (
        True, str(ca.cert_file), str(client.cert_file), str(client.key_file))
    assert str(address) == "mqtts://broker.example:8883"  # no file names or secrets in logs

    # A private CA alone (server authentication only) is fine too; and nothing set: the system's CAs.
    only_ca = load_settings(cls, overrides={"broker_url": "ssl://b:8883", "ca_file": str(ca.cert_file)})
    assert only_ca.broker_address().cert_file is None  # type: ignore[attr-defined]
    assert load_settings(cls, overrides={"broker_url": "mqtts://b"}).broker_address().ca_file is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", SETTINGS, ids=IDS)
def test_environment_variables_set_them(cls: type[BaseSettings], pki: tuple[TestCA, Issued],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ca, _ = pki
    prefix = cls.model_config["env_prefix"]
    monkeypatch.setenv(f"{prefix}BROKER_URL", "mqtts://b:8883")
    monkeypatch.setenv(f"{prefix}CA_FILE", str(ca.cert_file))
    assert load_settings(cls).ca_file == ca.cert_file  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", SETTINGS, ids=IDS)
@pytest.mark.parametrize("field", ["ca_file", "cert_file", "key_file"])
def test_a_tls_file_with_a_plaintext_url_fails_naming_the_field(cls: type[BaseSettings], field: str,
                                                               pki: tuple[TestCA, Issued]) -> None:
    ca, client = pki
    files = {"ca_file": ca.cert_file, "cert_file": client.cert_file, "key_file": client.key_file}
    overrides = {"broker_url": "mqtt://b:1883", "cert_file": str(client.cert_file), "key_file": str(client.key_file),
                 field: str(files[field])}
    with pytest.raises(ConfigError, match=rf"{field} \(--{field.replace('_', '-')} / .*{field.upper()}\): .*"
                                          r"only used over TLS: the broker URL must start with mqtts://"):
        load_settings(cls, overrides=overrides)


@pytest.mark.parametrize("cls", SETTINGS, ids=IDS)
def test_missing_unreadable_or_unpaired_files_fail_at_start_up(cls: type[BaseSettings], pki: tuple[TestCA, Issued],
                                                               tmp_path: Path) -> None:
    ca, client = pki
    url = {"broker_url": "mqtts://b:8883"}
    with pytest.raises(ConfigError, match=r"ca_file .*: .*ca_file '.*nope.pem' does not exist"):
        load_settings(cls, overrides={**url, "ca_file": str(tmp_path / "nope.pem")})
    with pytest.raises(ConfigError, match=r"key_file .*: .*is not a file"):
        load_settings(cls, overrides={**url, "cert_file": str(client.cert_file), "key_file": str(tmp_path)})
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        load_settings(cls, overrides={**url, "cert_file": str(client.cert_file)})
    with pytest.raises(ConfigError, match="cert_file and key_file go together"):
        load_settings(cls, overrides={**url, "key_file": str(client.key_file)})


@pytest.mark.parametrize(("app", "prefix"), [(coordinator_app, "FL_COORDINATOR_"), (agent_app, "FL_AGENT_")], ids=IDS)
def test_the_clis_have_the_flags(app: object, prefix: str) -> None:
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"})  # type: ignore[arg-type]
    assert result.exit_code == 0, result.output
    text = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", result.output))
    for flag in ("ca-file", "cert-file", "key-file"):
        assert f"--{flag}" in text
        assert f"{prefix}{flag.replace('-', '_').upper()}" in text


def test_the_link_verifies_the_broker_and_presents_its_certificate(pki: tuple[TestCA, Issued]) -> None:
    ca, client = pki
    address = BrokerAddress.parse("mqtts://127.0.0.1:8883").with_tls_files(ca.cert_file, client.cert_file,
                                                                            client.key_file)
    link = MqttLink("agent-a", address, lambda topic, payload, retained: None)
    context: ssl.SSLContext = link._client._ssl_context  # type: ignore[attr-defined]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert not link._client._tls_insecure  # type: ignore[attr-defined]


def test_a_key_that_does_not_match_its_certificate_fails_before_connecting(pki: tuple[TestCA, Issued]) -> None:
    ca, client = pki
    other = ca.client("agent-b")
    address = BrokerAddress.parse("mqtts://127.0.0.1:8883").with_tls_files(ca.cert_file, client.cert_file,
                                                                            other.key_file)
    with pytest.raises(ssl.SSLError):
        MqttLink("agent-a", address, lambda topic, payload, retained: None)


def test_broker_address_checks_what_it_is_given(pki: tuple[TestCA, Issued]) -> None:
    ca, _ = pki
    with pytest.raises(ValueError, match="ca_file is only used over TLS"):
        BrokerAddress.parse("mqtt://b").with_tls_files(ca_file=ca.cert_file)
    plain = BrokerAddress.parse("mqtt://u:p@b").with_tls_files()
    assert plain == BrokerAddress("b", 1883, False, "u", "p")
