"""The three ways to run agents on devices (deploy/systemd, deploy/compose, deploy/k3s).

Each file is checked by the tool of its world where that tool is installed (systemd-analyze;
the Compose Specification's JSON schema, as check-jsonschema ships it; kubernetes-validate),
and every command line and environment in it is parsed by the real CLI and resolved by the
real settings classes, so a renamed flag or a bad value fails here, not on a device.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer.main
import yaml
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from coordinator.app.cli import app as coordinator_app
from coordinator.settings import CoordinatorSettings
from edge_agent.cli import app as agent_app
from edge_agent.config import AgentSettings
from protocol.security.signing import SigningKey
from service_kit.settings import load_settings
from tests.chart import REPO
from tests.tls import TestCA

DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "edge-agent.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "edge-agent.env.example"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
DAEMONSET = DEPLOY / "k3s" / "edge-agent-daemonset.yaml"
KUBE_VERSIONS = ("1.25", kubernetes_validate.utils.latest_version())


# ---- shared: a deployment's command line and environment, resolved as the service would --------

def _command(app: typer.Typer, name: str) -> Any:
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]


def parse_args(app: typer.Typer, args: list[str]) -> dict[str, Any]:
    """The options a command line sets; an unknown flag raises (click's NoSuchOption)."""
    name, *rest = args
    params = _command(app, name).make_context(name, list(rest)).params
    return {k: v for k, v in params.items() if v is not None}


def resolve(cls: type[BaseSettings], app: typer.Typer, args: list[str], env: dict[str, str],
            monkeypatch: pytest.MonkeyPatch, files: dict[str, Path]) -> Any:
    """The settings the service starts with: its flags over its environment (and nothing of ours).

    ``files`` stands in local files for paths on the device that the settings open at start-up."""
    prefix = str(cls.model_config.get("env_prefix"))
    for name in [n for n in os.environ if n.startswith(prefix)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        assert name.startswith(prefix) and name[len(prefix):].lower() in cls.model_fields, f"{name}: no such setting"
        monkeypatch.setenv(name, str(files.get(value, value)))
    options = parse_args(app, args)
    options.pop("config", None)
    return load_settings(cls, None, {k: str(files.get(v, v)) if isinstance(v, str) else v for k, v in options.items()})


@pytest.fixture
def coordinator_pub(tmp_path: Path) -> Path:
    path = tmp_path / "coordinator.pub"
    path.write_text(SigningKey.generate().public_key.to_text() + "\n")
    return path


def dockerfile_env(path: Path) -> dict[str, str]:
    text = path.read_text().replace("\\\n", " ")
    block = re.search(r"^ENV (.*)$", text.split("FROM ")[-1], flags=re.MULTILINE)
    assert block is not None, path
    return dict(item.split("=", 1) for item in shlex.split(block.group(1)))


def test_a_bad_setting_exits_with_status_2() -> None:
    """The systemd unit's RestartPreventExitStatus=2 relies on it: no restart loop on bad configuration."""
    result = CliRunner().invoke(agent_app, ["run", "--device", "toaster"], env={})
    assert result.exit_code == 2, result.output
    assert "device" in result.output


# ---- systemd --------------------------------------------------------------------------------------

def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: [Section] headers, Key=value lines (keys may repeat), # comments."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep and key.strip().isidentifier(), f"{UNIT.name}:{number}: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key, [])
    assert len(values) == 1, f"{key}: {values}"
    return values[0]


def unit_exec_start() -> tuple[list[str], str]:
    """ExecStart's argv (%S as /var/lib, systemd's for system units) and the state directory."""
    service = parse_unit(UNIT.read_text())["Service"]
    state = "/var/lib/" + one(service, "StateDirectory")
    return shlex.split(one(service, "ExecStart").replace("%S/", "/var/lib/")), state


def test_the_unit_restarts_keeps_state_and_is_locked_down() -> None:
    unit = parse_unit(UNIT.read_text())
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert one(service, "Restart") == "on-failure"
    assert 1 <= int(one(service, "RestartSec")) <= 300
    assert one(service, "RestartPreventExitStatus") == "2"
    assert int(one(unit["Unit"], "StartLimitBurst")) >= 2 and int(one(unit["Unit"], "StartLimitIntervalSec")) > 0
    assert "network-online.target" in one(unit["Unit"], "After").split()
    assert one(unit["Install"], "WantedBy") == "multi-user.target"
    assert one(service, "EnvironmentFile") == "/etc/edgefl/edge-agent.env"  # no leading "-": missing fails loudly
    assert one(service, "User") == one(service, "Group") == "edgefl-agent"
    sysusers = (DEPLOY / "systemd" / "edgefl-agent.sysusers").read_text()
    assert re.search(r"^u edgefl-agent - ", sysusers, flags=re.MULTILINE)
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
                       "ProtectHome": "yes", "CapabilityBoundingSet": "", "UMask": "0077"}.items():
        assert one(service, key) == value, key
    assert "PrivateDevices" not in service  # a Jetson's GPU is a device node
    argv, state = unit_exec_start()
    assert one(service, "ReadWritePaths") == "%S/" + one(service, "StateDirectory")
    assert one(service, "WorkingDirectory") == "%S/" + one(service, "StateDirectory")
    assert argv[0] == "/opt/edgefl/bin/edge-agent" and argv[1] == "run"
    assert parse_args(agent_app, argv[1:])["state_dir"] == state


def env_example() -> dict[str, str]:
    lines = [line for line in ENV_EXAMPLE.read_text().splitlines() if line.strip()]
    assert all(line.startswith("#") for line in lines), "every variable of the example is commented out"
    settings = [line.lstrip("#") for line in lines if re.match(r"^#FL_AGENT_[A-Z0-9_]+=", line)]
    names = [line.partition("=")[0] for line in settings]
    assert len(names) == len(set(names)), names
    return dict(line.split("=", 1) for line in settings)


def test_the_example_environment_file_names_real_settings_only(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, coordinator_pub: Path) -> None:
    env = env_example()
    for needed in ("device", "broker_url", "broker_username", "broker_password", "agent_id", "ca_file",
                   "cert_file", "key_file", "coordinator_key", "federation", "data"):
        assert f"FL_AGENT_{needed.upper()}" in env, needed
    assert "FL_AGENT_STATE_DIR" not in env  # the unit owns it
    files: dict[str, Path] = {"/etc/edgefl/coordinator.pub": coordinator_pub}
    for name in ("FL_AGENT_CA_FILE", "FL_AGENT_CERT_FILE", "FL_AGENT_KEY_FILE"):
        files[env[name]] = tmp_path / Path(env[name]).name
        files[env[name]].write_text("PEM\n")
    # The agent reads its certificate's CN at start (it must be the agent id): a real one stands in.
    files[env["FL_AGENT_CERT_FILE"]].write_bytes(
        TestCA(tmp_path / "ca").client(env["FL_AGENT_AGENT_ID"]).cert_file.read_bytes())
    argv, state = unit_exec_start()
    settings = resolve(AgentSettings, agent_app, argv[1:], env, monkeypatch, files)
    assert settings.state_dir == Path(state) and settings.device == env["FL_AGENT_DEVICE"]
    assert settings.dp and settings.broker_username == settings.agent_id


def test_systemd_analyze_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd); the unit's structure is "
                    "checked by test_the_unit_restarts_keeps_state_and_is_locked_down")
    # verify insists that ExecStart's binary exists: point it at a stand-in, change nothing else.
    binary = tmp_path / "edge-agent"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(stat.S_IRWXU)
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/edgefl/bin/edge-agent", str(binary)))
    result = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True,
                            timeout=60, check=False)
    # Unknown keys and bad values are only warned about (exit status 0): any output is a failure.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr
    result = subprocess.run([analyze, "security", "--offline=true", "--no-pager", str(unit)],
                            capture_output=True, text=True, timeout=60, check=False)
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert level is not None, result.stdout[-2000:] + result.stderr
    assert float(level.group(1)) <= 3.0, result.stdout


# ---- Docker Compose lab -------------------------------------------------------------------------

def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json")
                        .read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_the_lab_validates_against_the_compose_specification() -> None:
    validator = compose_validator()
    lab = compose()
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(lab)]
    assert errors == []
    lab["services"]["broker"]["comand"] = ["sh"]  # the schema does catch a misspelt key
    assert not validator.is_valid(lab)


def agents(lab: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in lab["services"].items()
            if s.get("build", {}).get("dockerfile", "").startswith("deploy/edge-agent/")}


def lab_env(service: dict[str, Any], prefix: str) -> dict[str, str]:
    """The service's environment, with the lab password's ${...} filled in (from .env at run time)."""
    return {k: "lab-password" if v.startswith("${LAB_BROKER_PASSWORD:?") else v
            for k, v in service.get("environment", {}).items() if k.startswith(prefix)}


def test_every_build_and_bind_mount_exists() -> None:
    lab = compose()
    for name, service in lab["services"].items():
        if "build" in service:
            context = (COMPOSE_DIR / service["build"]["context"]).resolve()
            assert context == REPO, name
            assert (context / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).is_file(), f"{name}: {source}"
            else:
                assert source in lab["volumes"], f"{name}: volume {source} is not declared"


def test_the_lab_fleet_is_heterogeneous_and_keeps_its_state(
        monkeypatch: pytest.MonkeyPatch, coordinator_pub: Path) -> None:
    lab = compose()
    state_dir = Path(dockerfile_env(DEPLOY / "edge-agent" / "Dockerfile")["FL_AGENT_STATE_DIR"])
    fleet = {}
    for name, service in agents(lab).items():
        settings = resolve(AgentSettings, agent_app, service["command"], lab_env(service, "FL_AGENT_"), monkeypatch,
                           {"/enrolled/coordinator.pub": coordinator_pub})
        assert settings.broker_username == settings.agent_id and settings.broker_password is not None, name
        # Each agent talks to its site's broker only (tests/unit/deploy/test_compose_sites.py checks the sites).
        assert re.fullmatch(r"mqtt://site\d+-broker:1883", settings.broker_url) and settings.straggler_model()
        assert service["depends_on"][settings.broker_url[7:-5]]["condition"] == "service_started", name
        assert str(settings.signing_key_file) == "/enrolled/agent_key.pem", name
        state_volume, enrolled = service["volumes"]
        source, target = state_volume.split(":")
        assert state_dir.is_relative_to(target) and source.endswith("-state"), name
        assert enrolled["volume"]["subpath"] == f"enrolled/{settings.agent_id}" and enrolled["read_only"], name
        assert enrolled["target"] == "/enrolled" and service["read_only"] and service["cap_drop"] == ["ALL"]
        fleet[settings.agent_id] = settings
    assert len(fleet) >= 3 and len({s.device for s in fleet.values()}) == len(fleet), "one agent per device kind"
    assert len({v.split(":")[0] for s in agents(lab).values() for v in s["volumes"][:1]}) == len(fleet)
    partitions = {s.num_partitions for s in fleet.values()}
    assert partitions == {len(fleet)} and sorted(s.partition_index for s in fleet.values()) == list(range(len(fleet)))

    enroll = parse_args(coordinator_app, lab["services"]["enroll"]["command"])
    sites = lab["services"]["broker"]["environment"]["LAB_SITES"].split()
    assert sorted(enroll["agent_ids"]) == sorted([*fleet, *sites])
    assert lab["services"]["broker"]["environment"]["LAB_CLIENTS"].split() == ["coordinator"]
    site_clients = [c for s in sites for c in lab["services"][f"{s}-broker"]["environment"]["LAB_CLIENTS"].split()]
    assert sorted(c for c in site_clients if c != "site-aggregator") == sorted(fleet)


def mosquitto_conf(path: Path) -> dict[str, str]:
    return dict(line.split(None, 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def test_the_coordinator_fits_the_lab_broker_and_its_acl(monkeypatch: pytest.MonkeyPatch) -> None:
    lab = compose()
    service = lab["services"]["coordinator"]
    settings = resolve(CoordinatorSettings, coordinator_app, service["command"],
                       lab_env(service, "FL_COORDINATOR_"), monkeypatch, {})
    coordinator_state = Path(dockerfile_env(DEPLOY / "coordinator" / "Dockerfile")["FL_COORDINATOR_STATE_DIR"])
    enroll = parse_args(coordinator_app, lab["services"]["enroll"]["command"])
    assert enroll["state_dir"] == coordinator_state and Path(enroll["bundle_dir"]).parent == coordinator_state.parent
    assert ["coordinator-state:" + str(coordinator_state.parent)] == service["volumes"]
    assert settings.min_available_agents <= len(agents(lab)) and settings.broker_password is not None
    acl_user = re.search(r"^user (\S+)$", (DEPLOY / "mosquitto" / "acl").read_text(), flags=re.MULTILINE)
    assert acl_user is not None and settings.broker_username == acl_user.group(1)
    lab_conf = mosquitto_conf(COMPOSE_DIR / "mosquitto" / "mosquitto.conf")
    shipped = mosquitto_conf(DEPLOY / "mosquitto" / "mosquitto.conf")
    for key in ("max_queued_messages", "max_queued_bytes", "max_inflight_messages", "max_packet_size",
                "allow_anonymous", "use_username_as_clientid"):
        assert lab_conf[key] == shipped[key], key
    assert settings.max_update_bytes < int(lab_conf["max_packet_size"])
    mounts = dict(v.split(":")[:2] for v in lab["services"]["broker"]["volumes"])
    # start-broker.sh reads the shipped ACL where it is mounted and writes the lab's (plus the sites' bridges).
    assert mounts["../mosquitto/acl"] == shipped["acl_file"]
    assert Path(lab_conf["password_file"]).parent == Path(mounts["broker-data"]) == Path(lab_conf["acl_file"]).parent


def test_the_lab_broker_writes_a_password_entry_per_client(tmp_path: Path) -> None:
    if shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto_passwd is not installed (scripts/test.sh installs mosquitto)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Stands in for the broker only: the script must hand over to it with the lab config.
    (bin_dir / "mosquitto").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/mosquitto-args\n')
    (bin_dir / "mosquitto").chmod(stat.S_IRWXU)
    passwd, acl = tmp_path / "passwd", tmp_path / "acl"
    lab = compose()["services"]["broker"]["environment"]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MOSQUITTO_PASSWD_FILE": str(passwd),
           "MOSQUITTO_ACL_FILE": str(acl), "MOSQUITTO_ACL_BASE": str(DEPLOY / "mosquitto" / "acl"),
           "LAB_CLIENTS": lab["LAB_CLIENTS"], "LAB_SITES": lab["LAB_SITES"]}
    script = str(COMPOSE_DIR / "mosquitto" / "start-broker.sh")
    missing = subprocess.run(["sh", script], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert missing.returncode != 0 and "LAB_BROKER_PASSWORD" in missing.stderr
    result = subprocess.run(["sh", script], env={**env, "LAB_BROKER_PASSWORD": "lab-password"},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    users = [line.split(":")[0] for line in passwd.read_text().splitlines()]
    sites = env["LAB_SITES"].split()
    assert users == env["LAB_CLIENTS"].split() + [f"{s}-bridge" for s in sites] and len(sites) == 2
    lab_acl = acl.read_text()
    assert lab_acl.startswith((DEPLOY / "mosquitto" / "acl").read_text())
    for site in sites:
        block = lab_acl.split(f"\nuser {site}-bridge\n")[1].split("\n\n")[0].splitlines()
        assert f"topic write fl/default/sites/{site}/partials/#" in block and "topic read fl/default/notices/#" in block
        assert f"topic write fl/default/sites/{site}/roster" in block and f"topic read fl/default/sites/{site}/resync" in block
        assert not any("updates" in line or "agents/" in line for line in block), "statuses and updates stay at the site"
    assert "lab-password" not in passwd.read_text() and stat.S_IMODE(passwd.stat().st_mode) == 0o600
    assert (tmp_path / "mosquitto-args").read_text().split() == ["-c", "/mosquitto/config/mosquitto.conf"]


# ---- k3s DaemonSet ------------------------------------------------------------------------------

def daemonset() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    assert [d["kind"] for d in docs] == ["DaemonSet"]
    return docs[0]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_the_daemonset_validates_against_the_kubernetes_schema(version: str) -> None:
    try:
        kubernetes_validate.validate(daemonset(), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"invalid for Kubernetes {version}: {exc.message} at {list(exc.absolute_path)}") from None
    broken = daemonset()
    broken["spec"]["template"]["spec"]["containers"][0]["resorces"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_the_daemonset_keeps_state_on_the_node_and_reads_only_its_nodes_password(
        monkeypatch: pytest.MonkeyPatch, coordinator_pub: Path) -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env["FL_AGENT_AGENT_ID"] == env["FL_AGENT_BROKER_USERNAME"] == "spec.nodeName"
    script = container["command"][-1]
    exec_line = re.search(r"^exec (edge-agent .*)$", script, flags=re.MULTILINE)
    assert container["command"][:2] == ["sh", "-c"] and exec_line is not None
    argv = shlex.split(exec_line.group(1))
    node_env = {k: "rpi-node-1" if v == "spec.nodeName" else v for k, v in env.items()}
    settings = resolve(AgentSettings, agent_app, argv[1:], node_env, monkeypatch,
                       {env["FL_AGENT_COORDINATOR_KEY"]: coordinator_pub})
    assert settings.device == pod["nodeSelector"]["edgefl.io/device"]
    # the state directory is the node's, made beforehand and owned by the pod's user
    assert volumes["state"]["hostPath"]["type"] == "Directory"
    assert str(settings.state_dir) == mounts["state"]["mountPath"] and not mounts["state"].get("readOnly")
    # the broker password is this node's file in its own state directory: no volume holds every node's
    assert f'password_file="{mounts["state"]["mountPath"]}/broker_password"' in script
    assert not any("secret" in v for v in volumes.values())
    assert Path(env["FL_AGENT_COORDINATOR_KEY"]).parent == Path(mounts["coordinator-key"]["mountPath"])
    # locked down, as the image's user
    uid = int(re.findall(r"^USER (\d+):", (DEPLOY / "edge-agent" / "Dockerfile").read_text(), re.MULTILINE)[0])
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == uid
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"] and mounts["tmp"]["mountPath"] == "/tmp"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), kind


def test_the_daemonset_script_stops_without_a_password() -> None:
    script = daemonset()["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    result = subprocess.run(["sh", "-c", script], env={"PATH": os.environ["PATH"],
                                                         "FL_AGENT_AGENT_ID": "no-such-node-1f3a"},
                            capture_output=True, text=True, timeout=60, check=False)
    assert not Path("/var/lib/edgefl-agent/broker_password").exists()  # this machine is no prepared node
    assert result.returncode == 2 and "no broker password for no-such-node-1f3a: put it in" in result.stderr


# ---- docs ---------------------------------------------------------------------------------------

def test_the_guide_names_only_files_that_exist() -> None:
    guide = (REPO / "docs" / "deploying-agents.md").read_text()
    paths = set(re.findall(r"`((?:deploy|docs)/[^`\s]+)`", guide))
    assert {"deploy/systemd/edge-agent.service", "deploy/compose/compose.yaml",
            "deploy/k3s/edge-agent-daemonset.yaml"} <= paths
    assert [p for p in sorted(paths) if not (REPO / p).exists()] == []
