"""Configuration an operator gets wrong stops a service at start-up, in one line naming what to fix, and never
prints a secret (found in review: tracebacks for bad key, enrollment and TLS files and a taken port; the broker
password echoed in errors about other settings; misspelt variables and empty paths silently ignored)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from typer.testing import CliRunner

from coordinator.app.cli import app as coordinator_app
from coordinator.settings import CoordinatorSettings
from coordinator.sites.settings import SiteSettings
from edge_agent.cli import app as agent_app
from edge_agent.config import AgentSettings
from launcher.demo import app as demo_app
from protocol.transport.address import BrokerAddress
from service_kit.settings import ConfigError, load_settings

pytestmark = pytest.mark.timeout(120)  # a case that no longer fails at start-up would wait for a broker


def one_line_refusal(app: object, args: list[str], names: str) -> None:
    result = CliRunner().invoke(app, args)  # type: ignore[arg-type]
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output and "error: cannot start:" in result.output, result.output
    assert names in result.output, result.output


def coordinator_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["run", "--federation", "t", "--state-dir", str(tmp_path / "state"), "--http-port", "0", *extra]


def test_a_signing_key_file_that_is_not_a_key_is_named(tmp_path: Path) -> None:
    (tmp_path / "key.pem").write_text("garbage")
    (tmp_path / "folder").mkdir()
    one_line_refusal(coordinator_app, coordinator_args(tmp_path, "--signing-key-file", str(tmp_path / "key.pem")),
                     "signing key file")
    one_line_refusal(coordinator_app, coordinator_args(tmp_path, "--signing-key-file", str(tmp_path / "folder")),
                     "Is a directory")


def test_an_enrollment_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    (tmp_path / "enrolled.json").write_text("{bad")
    one_line_refusal(coordinator_app, coordinator_args(tmp_path, "--enrolled-agents-file",
                                                       str(tmp_path / "enrolled.json")), "enrolled.json")


def test_a_metrics_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["run", "--federation", "t", "--state-dir", str(tmp_path / "state"), "--http-host", "127.0.0.1",
                "--http-port", str(port)]
        one_line_refusal(coordinator_app, args, f"cannot serve /metrics on 127.0.0.1:{port}")


def test_tls_files_that_are_not_pem_are_named_by_coordinator_and_agent(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("not a certificate")
    tls = ["--broker-url", "mqtts://localhost:8883", "--ca-file", str(tmp_path / "ca.crt")]
    one_line_refusal(coordinator_app, coordinator_args(tmp_path, *tls), "ca_file")
    one_line_refusal(agent_app, ["run", "--state-dir", str(tmp_path / "agent"), *tls], "ca_file")


def test_an_agent_signing_key_path_that_is_a_directory_is_named(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    one_line_refusal(agent_app, ["run", "--state-dir", str(tmp_path / "agent"), "--signing-key-file",
                                 str(tmp_path / "folder")], "signing key file")


def test_a_site_without_the_roots_key_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "root.pub").write_text("garbage")
    for key in ("root.pub", "missing.pub"):
        one_line_refusal(coordinator_app, ["site", "--site-id", "s1", "--federation", "t", "--state-dir",
                                           str(tmp_path / "site"), "--coordinator-key", str(tmp_path / key)],
                         "coordinator_key")


def test_errors_about_other_settings_never_print_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FL_AGENT_BROKER_PASSWORD", "s3cret-agent")
    with pytest.raises(ConfigError) as agent:
        load_settings(AgentSettings, None, {"partition_index": 3})  # a check across fields: its input is everything
    assert "partition_index 3" in str(agent.value) and "s3cret" not in str(agent.value)
    with pytest.raises(ConfigError) as site:
        load_settings(SiteSettings, None, {"broker_password": "s3cret-site"})  # site_id missing
    assert "site_id" in str(site.value) and "s3cret" not in str(site.value)
    with pytest.raises(ConfigError) as own:
        load_settings(CoordinatorSettings, None, {"broker_password": ["s3cret-list"]})  # its own field's error
    assert "broker_password" in str(own.value) and "s3cret" not in str(own.value)


class TokenSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FL_TEST_", extra="forbid")
    api_token: SecretStr | None = None


def test_an_optional_secret_is_never_printed_whatever_its_name() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(TokenSettings, None, {"api_token": ["t0ken-value"]})
    assert "api_token" in str(refused.value) and "t0ken" not in str(refused.value)


def test_a_misspelt_environment_variable_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FL_COORDINATOR_ROUND", "5")  # rounds
    with pytest.raises(ConfigError, match="FL_COORDINATOR_ROUND"):
        load_settings(CoordinatorSettings)


@pytest.mark.parametrize("where", ["environment", "yaml", "flag"])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    where: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("state_dir: ''\n" if where == "yaml" else "{}\n")
    if where == "environment":
        monkeypatch.setenv("FL_COORDINATOR_STATE_DIR", "")
    with pytest.raises(ConfigError, match="state_dir: an empty path"):
        load_settings(CoordinatorSettings, config, {"state_dir": ""} if where == "flag" else None)


def test_a_config_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00r\x00o")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(CoordinatorSettings, tmp_path / "bin.yaml")


@pytest.mark.parametrize("values, named", [
    ({"seed": -5}, "seed"),  # numpy's generator refused it when round 1 opened
    ({"aggregator": "trimmed_mean", "byzantine_f": 1, "trim_beta": 0.0}, "trim_beta above 0"),
    ({"aggregator": "krum", "byzantine_f": 10, "max_agents_per_round": 20}, "needs 23 updates"),
    ({"aggregator": "median", "byzantine_f": 3, "max_agents_per_round": 6}, "needs 7 updates"),
    ({"max_known_agents": 1, "min_available_agents": 2}, "no round would open"),
    ({"broker_url": "mqtt://localhost:0"}, "port 0"),
    ({"learning_rate_decay": 0.5, "rounds": 40}, "learning_rate_decay 0.5 over 40 rounds"),  # 2^-39 underflows
    ({"learning_rate_decay": 1.5}, "learning_rate_decay"),
])
def test_settings_no_round_could_run_with_are_refused_at_start_up(values: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(CoordinatorSettings, None, values)


def test_settings_a_round_can_run_with_pass() -> None:
    load_settings(CoordinatorSettings, None, {"aggregator": "krum", "byzantine_f": 1, "max_agents_per_round": 5})
    load_settings(CoordinatorSettings, None, {"aggregator": "trimmed_mean", "byzantine_f": 1, "trim_beta": 0.2})
    assert BrokerAddress.parse("mqtt://localhost").port == 1883


@pytest.mark.parametrize("flags, named", [
    (["--learning-rate", "20"], "learning_rate"),
    (["--local-epochs", "5000"], "local_epochs"),
    (["--secure", "--deadline", "2"], "leaves no time to train"),
    (["--algorithm", "fedproto", "--dp-epsilon", "5"], "dp-epsilon"),
])
def test_the_demo_refuses_what_its_coordinator_or_agents_would_before_starting_anything(
        tmp_path: Path, flags: list[str], named: str) -> None:
    result = CliRunner().invoke(demo_app, [*flags, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and named in " ".join(result.output.split()), result.output
    assert not (tmp_path / "run").exists()  # nothing was started
