"""The Helm chart renders, lints clean and validates for its default and CI values files.

Rendering uses helm-python-sdk (Helm's Go SDK, no binary); every rendered object is checked
against the Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields fail) of the
oldest and newest Kubernetes the chart supports, and the Prometheus Operator kinds against
crd_schemas.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from coordinator.settings import CoordinatorSettings
from service_kit.settings import load_settings
from tests.chart import (
    CHART,
    FIRST_INSTALL_PASSWORD,
    FULLNAME,
    NAMESPACE,
    REPO,
    VALUES_FILES,
    Rendered,
    container,
    render,
    values_of,
)
from tests.unit.deploy.crd_schemas import SCHEMAS

KUBE_VERSIONS = ("1.25", kubernetes_validate.utils.latest_version())
CASES = [None, *VALUES_FILES]
IDS = ["defaults", *(p.name.removesuffix("-values.yaml") for p in VALUES_FILES)]
STANDARD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                   "app.kubernetes.io/managed-by", "app.kubernetes.io/component", "helm.sh/chart")


def test_there_are_values_files_for_each_deployment_shape() -> None:
    names = {p.name for p in VALUES_FILES}
    assert {"external-broker-values.yaml", "bundled-broker-values.yaml", "servicemonitor-values.yaml",
            "existing-secret-values.yaml", "client-certificate-values.yaml", "network-policy-values.yaml"} <= names


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_lint_reports_no_errors_or_warnings(values_file: Path | None) -> None:
    report = helm.lint(CHART, values_of(values_file), namespace=NAMESPACE, kube_version="v1.30.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_every_object_validates_against_its_schema(values_file: Path | None) -> None:
    rendered = render(values_of(values_file))
    assert len(rendered.objects) >= 5
    for obj in rendered.objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        custom = SCHEMAS.get((obj["apiVersion"], obj["kind"]))
        if custom is not None:
            jsonschema.validate(obj, custom)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{where} is invalid for Kubernetes {version}: {exc.message} "
                                     f"at {list(exc.absolute_path)}") from None
        labels = obj["metadata"].get("labels", {})
        if obj["kind"] != "ServiceAccount":
            assert all(label in labels for label in STANDARD_LABELS), (where, labels)
        assert obj["metadata"]["namespace"] in (NAMESPACE, "monitoring"), where


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_every_container_is_locked_down(values_file: Path | None) -> None:
    rendered = render(values_of(values_file))
    pods = [d["spec"]["template"]["spec"] for d in rendered.all("Deployment")]
    pods += [p["spec"] for p in rendered.all("Pod")]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["capabilities"]["drop"]) == (
                True, False, ["ALL"]), c["name"]
            assert "memory" in c["resources"]["limits"] and c["resources"]["requests"], c["name"]


@pytest.mark.parametrize("values_file", CASES, ids=IDS)
def test_coordinator_probes_config_and_volumes_agree(values_file: Path | None, tmp_path: Path) -> None:
    values = values_of(values_file)
    rendered = render(values)
    deployment = rendered.get("Deployment", FULLNAME)
    coordinator = container(deployment, "coordinator")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"

    # The config file the container reads is valid for the real settings class.
    config_path = coordinator["args"][coordinator["args"].index("--config") + 1]
    mounts = {m["mountPath"]: m for m in coordinator["volumeMounts"]}
    assert str(Path(config_path).parent) in mounts
    text = rendered.get("ConfigMap", FULLNAME)["data"][Path(config_path).name]
    # The TLS files it names come from a mounted Secret's items; here they are local stand-ins.
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for key, path in _tls_settings(yaml.safe_load(text)).items():
        mount = mounts[str(Path(path).parent)]
        assert mount["readOnly"] is True, key
        secret = volumes[mount["name"]]["secret"]
        assert Path(path).name in {item["path"] for item in secret["items"]}, (key, secret)
        (tmp_path / Path(path).name).write_text("PEM\n")
        text = text.replace(f"{key}: {path}\n", f"{key}: {tmp_path / Path(path).name}\n")
    (tmp_path / "c.yaml").write_text(text)
    settings = load_settings(CoordinatorSettings, tmp_path / "c.yaml")
    assert settings.federation == values.get("federation", "default")

    # Probes hit /healthz and /readyz on the port the coordinator listens on.
    port = {p["name"]: p["containerPort"] for p in coordinator["ports"]}["http"]
    assert port == settings.http_port
    probes = {kind: coordinator[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {kind: (p["path"], p["port"]) for kind, p in probes.items()} == {
        "startupProbe": ("/healthz", "http"), "livenessProbe": ("/healthz", "http"), "readinessProbe": ("/readyz", "http")}
    service = rendered.get("Service", FULLNAME)
    assert service["spec"]["ports"][0]["targetPort"] == "http"

    # Everything written goes to volumes: the state dir and /tmp.
    assert any(str(settings.state_dir).startswith(path + "/") for path in mounts), settings.state_dir
    assert "/tmp" in mounts
    state = volumes[mounts[str(settings.state_dir.parent)]["name"]]
    claim = values.get("persistence", {}).get("existingClaim") or f"{FULLNAME}-state"
    assert state["persistentVolumeClaim"]["claimName"] == claim
    assert (rendered.maybe("PersistentVolumeClaim", f"{FULLNAME}-state") is not None) == (
        claim == f"{FULLNAME}-state")


def _tls_settings(config: dict[str, Any]) -> dict[str, str]:
    return {key: config[key] for key in ("ca_file", "cert_file", "key_file") if key in config}


def _env(rendered: Rendered, name: str) -> dict[str, Any]:
    return {e["name"]: e for e in container(rendered.get("Deployment", FULLNAME), "coordinator")["env"]}[name]


def test_the_notes_put_no_password_on_a_command_line_nor_a_private_key_on_the_state_volume() -> None:
    """ps and docker inspect show a command line; a bundle holds the device's private key, and the state volume is
    kept on uninstall and backed up."""
    for values in ({}, {"mosquitto": {"tls": {"enabled": True, "existingSecret": "broker-tls"}}}):
        notes = render(values).notes
        assert "--broker-password" not in notes and "FL_AGENT_BROKER_PASSWORD" in notes
        assert "--bundle-dir /tmp/bundles" in notes and "/var/lib/edgefl/state/bundles" not in notes


def test_defaults_bundle_a_broker_with_the_given_password() -> None:
    rendered = render()  # plus broker.password, which a first install must give
    settings = yaml.safe_load(rendered.get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    assert settings["broker_url"] == f"mqtt://{FULLNAME}-mosquitto:1883"
    service = rendered.get("Service", f"{FULLNAME}-mosquitto")
    assert service["spec"]["ports"][0]["port"] == 1883
    assert rendered.secret_value(f"{FULLNAME}-broker", "password") == FIRST_INSTALL_PASSWORD
    assert _env(rendered, "FL_COORDINATOR_BROKER_PASSWORD")["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-broker", "key": "password"}
    init = container(rendered.get("Deployment", f"{FULLNAME}-mosquitto"), "passwords")
    assert {e["name"]: e for e in init["env"]}["COORDINATOR_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == (
        f"{FULLNAME}-broker")
    assert "no agent can connect" in rendered.notes
    assert rendered.get("ConfigMap", f"{FULLNAME}-dashboards")["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert not rendered.all("ServiceMonitor") and not rendered.all("PrometheusRule")


def test_external_broker_values() -> None:
    rendered = render(values_of(CHART / "ci" / "external-broker-values.yaml"))
    assert not [o for o in rendered.objects if "mosquitto" in o["metadata"]["name"]]
    settings = yaml.safe_load(rendered.get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    assert (settings["broker_url"], settings["federation"], settings["rounds"]) == (
        "mqtts://mqtt.example.com:8883", "factory-7", 50)
    assert rendered.secret_value(f"{FULLNAME}-broker", "password") == "not-a-real-password"
    assert _env(rendered, "FL_COORDINATOR_BROKER_USERNAME")["value"] == "coordinator-factory-7"
    assert rendered.maybe("ConfigMap", f"{FULLNAME}-dashboards") is None


def test_existing_secret_values() -> None:
    rendered = render(values_of(CHART / "ci" / "existing-secret-values.yaml"))
    assert rendered.maybe("Secret", f"{FULLNAME}-broker") is None
    assert _env(rendered, "FL_COORDINATOR_BROKER_USERNAME")["valueFrom"]["secretKeyRef"] == {
        "name": "fl-broker-credentials", "key": "user"}
    assert _env(rendered, "FL_COORDINATOR_BROKER_PASSWORD")["valueFrom"]["secretKeyRef"] == {
        "name": "fl-broker-credentials", "key": "pass"}
    assert _env(rendered, "FL_COORDINATOR_LOG_LEVEL")["value"] == "DEBUG"


def test_servicemonitor_values_scrape_the_coordinator_and_ship_the_rules() -> None:
    rendered = render(values_of(CHART / "ci" / "servicemonitor-values.yaml"))
    monitor = rendered.get("ServiceMonitor", FULLNAME)
    service = rendered.get("Service", FULLNAME)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rule = rendered.get("PrometheusRule", FULLNAME)
    assert rule["spec"] == yaml.safe_load((REPO / "dashboards" / "alerts.yaml").read_text())
    dashboards = rendered.get("ConfigMap", f"{FULLNAME}-dashboards")
    assert dashboards["metadata"]["namespace"] == "monitoring"
    assert dashboards["metadata"]["annotations"]["grafana_folder"] == "Federated learning"
    for path in (REPO / "dashboards").glob("*.json"):
        assert json.loads(dashboards["data"][path.name]) == json.loads(path.read_text())


def test_bundled_broker_values() -> None:
    rendered = render(values_of(CHART / "ci" / "bundled-broker-values.yaml"))
    agents = rendered.secret_value(f"{FULLNAME}-mosquitto-agents", "passwd").splitlines()
    assert agents == ["jetson-0:jetson-0-password", "rpi-1:rpi:1 password"]
    config = rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["mosquitto.conf"]
    assert "listener 8883" in config and "certfile /mosquitto/tls/tls.crt" in config
    assert "persistence true" in config
    # TLS on: no plaintext listener, and the coordinator connects over TLS too, trusting the
    # CA that cert-manager puts beside the broker's certificate.
    assert _listeners(config) == {8883: ["certfile /mosquitto/tls/tls.crt", "keyfile /mosquitto/tls/tls.key",
                                         "use_username_as_clientid true"]}
    service = rendered.get("Service", f"{FULLNAME}-mosquitto")
    assert service["spec"]["type"] == "LoadBalancer"
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(8883, "mqtts")]
    broker = container(rendered.get("Deployment", f"{FULLNAME}-mosquitto"), "mosquitto")
    assert [p["name"] for p in broker["ports"]] == ["mqtts"]
    assert broker["livenessProbe"]["tcpSocket"]["port"] == broker["readinessProbe"]["tcpSocket"]["port"] == "mqtts"
    settings = yaml.safe_load(rendered.get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    assert settings["broker_url"] == f"mqtts://{FULLNAME}-mosquitto:8883"
    assert _tls_settings(settings) == {"ca_file": "/etc/edgefl-tls/ca/ca.crt"}
    assert _secret_volume(rendered, FULLNAME, "/etc/edgefl-tls/ca") == {
        "secretName": "greenhouse-broker-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert "--broker-url mqtts://<broker address>:8883 --ca-file" in rendered.notes
    assert "mqtt://" not in rendered.notes.replace("broker: mqtts://", "")
    assert "jetson-0-password" not in rendered.notes
    assert rendered.maybe("Secret", f"{FULLNAME}-broker") is None  # the password is in greenhouse-coordinator
    assert rendered.get("PersistentVolumeClaim", f"{FULLNAME}-mosquitto-data")["spec"]["resources"] == {
        "requests": {"storage": "2Gi"}}


def _listeners(config: str) -> dict[int, list[str]]:
    """mosquitto.conf's listeners and the listener options below each (up to the next listener or global option)."""
    per_listener = {"certfile", "keyfile", "cafile", "require_certificate", "use_identity_as_username",
                    "use_username_as_clientid"}
    listeners: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in config.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        option = line.split()[0]
        if option == "listener":
            current = listeners.setdefault(int(line.split()[1]), [])
        elif option in per_listener:
            assert current is not None, f"{line!r} before any listener"
            current.append(line)
        else:
            current = None
    return listeners


def _secret_volume(rendered: Rendered, deployment: str, mount_path: str) -> dict[str, Any]:
    spec = rendered.get("Deployment", deployment)["spec"]["template"]["spec"]
    mounts = [m for c in spec["containers"] for m in c["volumeMounts"] if m["mountPath"] == mount_path]
    assert len(mounts) == 1 and mounts[0]["readOnly"] is True, mounts
    return {v["name"]: v for v in spec["volumes"]}[mounts[0]["name"]]["secret"]


def test_client_certificate_values() -> None:
    """Device identity by certificate: the broker requires one from the device CA, its CN is the username."""
    rendered = render(values_of(CHART / "ci" / "client-certificate-values.yaml"))
    config = rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["mosquitto.conf"]
    assert _listeners(config) == {8883: [
        "certfile /mosquitto/tls/tls.crt", "keyfile /mosquitto/tls/tls.key", "cafile /mosquitto/client-ca/ca.crt",
        "require_certificate true", "use_identity_as_username true", "use_username_as_clientid true"]}
    assert _secret_volume(rendered, f"{FULLNAME}-mosquitto", "/mosquitto/client-ca") == {
        "secretName": "factory-9-device-ca", "items": [{"key": "devices.pem", "path": "ca.crt"}]}
    assert _secret_volume(rendered, f"{FULLNAME}-mosquitto", "/mosquitto/tls") == {
        "secretName": "factory-9-broker-tls"}

    # The coordinator presents its own certificate and trusts the broker through its CA Secret.
    settings = yaml.safe_load(rendered.get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    assert settings["broker_url"] == f"mqtts://{FULLNAME}-mosquitto:8883"
    assert _tls_settings(settings) == {"ca_file": "/etc/edgefl-tls/ca/ca.crt",
                                       "cert_file": "/etc/edgefl-tls/client/tls.crt",
                                       "key_file": "/etc/edgefl-tls/client/tls.key"}
    assert _secret_volume(rendered, FULLNAME, "/etc/edgefl-tls/ca") == {
        "secretName": "factory-9-broker-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert _secret_volume(rendered, FULLNAME, "/etc/edgefl-tls/client") == {
        "secretName": "factory-9-coordinator-cert", "defaultMode": 0o440,
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}

    # The notes tell agents to use mqtts and their certificate, and name no secret value.
    assert "--broker-url mqtts://<broker address>:8883" in rendered.notes
    assert "--cert-file <agent cert> --key-file <agent key>" in rendered.notes
    assert "--broker-password" not in rendered.notes
    # No listener checks passwords: none is required, stored or passed to the coordinator.
    assert rendered.maybe("Secret", f"{FULLNAME}-broker") is None
    init = container(rendered.get("Deployment", f"{FULLNAME}-mosquitto"), "passwords")
    assert {e["name"] for e in init["env"]} == {"COORDINATOR_USERNAME"}
    assert "FL_COORDINATOR_BROKER_PASSWORD" not in {
        e["name"] for e in container(rendered.get("Deployment", FULLNAME), "coordinator")["env"]}


def test_a_plaintext_listener_beside_tls_only_when_asked() -> None:
    values = {"mosquitto": {"plaintextListener": True, "tls": {"enabled": True, "existingSecret": "tls"}},
              "broker": {"password": "coordinator-secret"}}
    rendered = render(values)
    config = rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["mosquitto.conf"]
    # Each listener names the client by its username: %c in the ACL cannot be spoofed on either.
    assert _listeners(config) == {
        1883: ["use_username_as_clientid true"],
        8883: ["certfile /mosquitto/tls/tls.crt", "keyfile /mosquitto/tls/tls.key", "use_username_as_clientid true"]}
    assert "INSECURE" in config
    service = rendered.get("Service", f"{FULLNAME}-mosquitto")
    assert [p["port"] for p in service["spec"]["ports"]] == [1883, 8883]
    # The coordinator still uses TLS; the notes warn about the plaintext port.
    settings = yaml.safe_load(rendered.get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    assert settings["broker_url"] == f"mqtts://{FULLNAME}-mosquitto:8883"
    assert "WARNING: mosquitto.plaintextListener is on: port 1883" in rendered.notes
    assert "coordinator-secret" not in rendered.notes
    # Without TLS the plaintext listener is the only one, whatever plaintextListener says.
    plain = render({"mosquitto": {"plaintextListener": False}})
    assert _listeners(plain.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["mosquitto.conf"]) == {
        1883: ["use_username_as_clientid true"]}
    assert "--broker-url mqtt://<broker address>:1883" in plain.notes and "WARNING: mosquitto.tls.enabled is false" in (
        plain.notes)


def test_the_acl_pins_every_client_to_the_charts_federation() -> None:
    acl = render({"federation": "greenhouse"}).get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["acl"]
    rules = [line.split() for line in acl.splitlines() if line.startswith(("topic ", "pattern "))]
    assert rules and all(topic.startswith("fl/greenhouse/") for _, _, topic in rules), rules
    assert ["pattern", "write", "fl/greenhouse/updates/%c/#"] in rules
    assert "fl/+/" not in acl


def test_each_site_bridge_gets_a_password_and_the_acl_block_the_acl_documents() -> None:
    """``mosquitto.sites``: one ``<id>-bridge`` login each, confined to its own site's roster and partials (the
    block deploy/mosquitto/acl shows in a comment, and the compose lab writes)."""
    sites = [{"id": "farm-1", "password": "f1-pw"}, {"id": "store-7", "password": "s7-pw"}]
    rendered = render({"mosquitto": {"agents": [{"username": "rpi-1", "password": "rpi-pw"}], "sites": sites}})
    passwd = rendered.secret_value(f"{FULLNAME}-mosquitto-agents", "passwd").splitlines()
    assert passwd == ["rpi-1:rpi-pw", "farm-1-bridge:f1-pw", "store-7-bridge:s7-pw"]
    acl = rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["acl"]
    shipped = (REPO / "deploy" / "mosquitto" / "acl").read_text()
    documented = [line.removeprefix("#   ") for line in shipped.splitlines()
                  if line.startswith("#   ") and ("farm-1" in line or line.startswith("#   topic"))]
    blocks = ["", *documented, "", *(line.replace("farm-1", "store-7") for line in documented)]
    assert acl == shipped + "\n".join(blocks) + "\n"
    assert render().get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["acl"] == shipped  # no sites: unchanged


def test_an_external_broker_over_tls_with_the_coordinators_certificate() -> None:
    rendered = render({"mosquitto": {"enabled": False}, "broker": {
        "url": "mqtts://mqtt.example.com:8883", "tls": {"clientCertSecret": "coord-cert"}}})
    settings = yaml.safe_load(rendered.get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    # No CA Secret: the system's CAs check the broker's certificate.
    assert _tls_settings(settings) == {"cert_file": "/etc/edgefl-tls/client/tls.crt",
                                       "key_file": "/etc/edgefl-tls/client/tls.key"}
    assert _secret_volume(rendered, FULLNAME, "/etc/edgefl-tls/client")["secretName"] == "coord-cert"


@pytest.mark.parametrize(("values", "message"), [
    ({"mosquitto": {"enabled": False}}, "broker.url is required"),
    ({"coordinator": {"config": {"state_dir": "/x"}}}, "coordinator.config.state_dir is set by the chart"),
    ({"broker": {"existingSecret": {"name": "s", "usernameKey": "u"}}}, "cannot be used with the bundled broker"),
    ({"mosquitto": {"tls": {"enabled": True}}}, "needs mosquitto.tls.existingSecret"),
    ({"mosquitto": {"tls": {"requireClientCertificate": True, "clientCASecret": "ca"}},
      "broker": {"tls": {"clientCertSecret": "c"}}}, "requireClientCertificate needs mosquitto.tls.enabled"),
    ({"mosquitto": {"tls": {"enabled": True, "existingSecret": "t", "requireClientCertificate": True}},
      "broker": {"tls": {"clientCertSecret": "c"}}}, "needs mosquitto.tls.clientCASecret"),
    ({"mosquitto": {"tls": {"enabled": True, "existingSecret": "t", "requireClientCertificate": True,
                            "clientCASecret": "ca"}}}, "needs broker.tls.clientCertSecret"),
    ({"mosquitto": {"enabled": False}, "broker": {"url": "mqtt://b:1883", "tls": {"caSecret": "ca"}}},
     "only used over TLS"),
    ({"coordinator": {"config": {"ca_file": "/x"}}}, "coordinator.config.ca_file is set by the chart"),
    ({"mosquitto": {"tls": {"clientCASecret": "Not_A_Name"}}}, "/mosquitto/tls/clientCASecret"),
    ({"federation": "a/b"}, "/federation"),
    ({"mosquitto": {"agents": [{"username": "bad id", "password": "p"}]}}, "/mosquitto/agents/0/username"),
    ({"coordinator": {"httpPort": 70000}}, "/coordinator/httpPort"),
    ({"broker": {"url": "http://broker"}}, "/broker/url"),
    ({"persistence": {"enabled": "yes"}}, "/persistence/enabled"),
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
])
def test_bad_values_fail_naming_the_problem(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message.replace("(", r"\(")):
        render(values)


def test_chart_files_match_their_sources() -> None:
    """The chart can only ship files inside it: scripts/sync-chart-files.sh copies them in."""
    hint = "run scripts/sync-chart-files.sh"
    sources = sorted(p.name for p in (REPO / "dashboards").glob("*.json"))
    assert sources == sorted(p.name for p in (CHART / "files" / "dashboards").glob("*.json")), hint
    for name in sources:
        assert (CHART / "files" / "dashboards" / name).read_bytes() == (REPO / "dashboards" / name).read_bytes(), hint
    assert (CHART / "files" / "alerts.yaml").read_bytes() == (REPO / "dashboards" / "alerts.yaml").read_bytes(), hint
    acl = render().get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["acl"]
    assert acl == (REPO / "deploy" / "mosquitto" / "acl").read_text(), hint
    renamed = render({"broker": {"username": "coord-7"}}).get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["acl"]
    assert "\nuser coord-7\n" in renamed and "\nuser coordinator\n" not in renamed


def test_the_packaged_chart_renders_like_the_directory(tmp_path: Path) -> None:
    """`helm package`: the archive carries files/ (dashboards, rules, ACL) and leaves ci/ out."""
    archive = helm.package(CHART, destination=tmp_path)
    with helm.Chart.load(archive) as chart:
        names = {f["name"] for f in chart.files}
        packaged = chart.render(values={"broker": {"password": "p"}}, name="fl", namespace=NAMESPACE)
    assert "files/alerts.yaml" in names and not any(n.startswith("ci/") for n in names)
    with helm.Chart.load(CHART) as chart:
        directory = chart.render(values={"broker": {"password": "p"}}, name="fl", namespace=NAMESPACE)
    assert packaged == directory


def test_a_plugin_tasks_card_is_mounted_and_named_in_the_config(tmp_path: Path) -> None:
    from protocol.tasks import TaskCard

    card = TaskCard(name="acme-defects", version="2.0", classes=("ok", "scratch", "dent"), families=("small", "large"),
                    embedding_dim=32)
    rendered = render({"coordinator": {"taskCard": json.loads(card.to_json())}})
    data = rendered.get("ConfigMap", FULLNAME)["data"]
    config = yaml.safe_load(data["coordinator.yaml"])
    coordinator = container(rendered.get("Deployment", FULLNAME), "coordinator")
    mounted = {m["mountPath"] for m in coordinator["volumeMounts"]}
    assert config["task"] == "/etc/edgefl/task-card.json" and "/etc/edgefl" in mounted
    assert TaskCard.model_validate_json(data["task-card.json"]) == card  # what the coordinator will read
    (tmp_path / "task-card.json").write_text(data["task-card.json"])
    config["task"] = str(tmp_path / "task-card.json")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert load_settings(CoordinatorSettings, tmp_path / "c.yaml").task_card() == card
    default = render({}).get("ConfigMap", FULLNAME)["data"]
    assert "task-card.json" not in default and "task" not in yaml.safe_load(default["coordinator.yaml"])


@pytest.mark.parametrize("agent", ["coordinator", "farm-1-bridge"])
def test_a_device_account_cannot_take_the_coordinators_or_a_bridges_broker_username(agent: str) -> None:
    """Its login would get that account's ACL grants: rounds/current, global/#, notices, the secure relays, or a
    site's roster and partials (found in review)."""
    values = {"mosquitto": {"agents": [{"username": agent, "password": "device-pw"}],
                            "sites": [{"id": "farm-1", "password": "bridge-pw"}]}}
    with pytest.raises(Exception, match="broker username; a device logging in with it would get"):
        render(values)
