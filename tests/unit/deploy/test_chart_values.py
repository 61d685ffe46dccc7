"""The chart as a subchart and under GitOps, its checked values, and its optional pod plumbing.

Covers: `global` from a parent chart, byte-identical `helm template` output, the password a first
install must give, coordinator.settings checked against the coordinator's own settings model,
imagePullSecrets on every pod, the NetworkPolicies, extra volumes and envFrom, and NOTES.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python as helm
import pytest
import yaml

from coordinator.settings import CoordinatorSettings
from service_kit.settings import load_settings
from tests.chart import CHART, FULLNAME, NAMESPACE, RELEASE, REPO, Rendered, container, manifests, render, values_of

BROKER = f"{FULLNAME}-mosquitto"
COORDINATOR_LABELS = {"app.kubernetes.io/name": "edgefl-coordinator", "app.kubernetes.io/instance": RELEASE,
                      "app.kubernetes.io/component": "coordinator"}
BROKER_LABELS = {**COORDINATOR_LABELS, "app.kubernetes.io/component": "mosquitto"}
TEST_POD_LABELS = {**COORDINATOR_LABELS, "app.kubernetes.io/component": "test"}


def _schema_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_config_schema", REPO / "scripts" / "chart_config_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pods(rendered: Rendered) -> dict[str, dict[str, Any]]:
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in rendered.all("Deployment")}
    pods |= {p["metadata"]["name"]: p["spec"] for p in rendered.all("Pod")}
    return pods


# --- as a subchart ---------------------------------------------------------------------------


def test_global_values_are_accepted() -> None:
    rendered = render({"global": {"foo": "bar", "storageClass": "fast"}})
    assert rendered.get("Deployment", FULLNAME)


def test_it_renders_as_a_subchart_of_a_parent_that_passes_globals(tmp_path: Path) -> None:
    parent = tmp_path / "platform"
    shutil.copytree(CHART, parent / "charts" / "edgefl-coordinator")
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: platform\nversion: 1.0.0\n")
    (parent / "values.yaml").write_text(yaml.safe_dump({
        "global": {"imagePullSecrets": [{"name": "platform-registry"}], "domain": "example.com"},
        "edgefl-coordinator": {"broker": {"password": "p"}, "federation": "plant-3"},
    }))
    with helm.Chart.load(parent) as chart:
        files = chart.render(name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = [doc for path, text in files.items() if path.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc]
    pods = _pods(Rendered(objects, ""))
    assert set(pods) == {FULLNAME, BROKER, f"{FULLNAME}-test"}
    assert all(pod["imagePullSecrets"] == [{"name": "platform-registry"}] for pod in pods.values()), pods


# --- GitOps: the same values render the same bytes -------------------------------------------


@pytest.mark.parametrize("values_file", [None, *sorted((CHART / "ci").glob("*-values.yaml"))],
                         ids=lambda p: "defaults" if p is None else p.name.removesuffix("-values.yaml"))
def test_two_renders_of_the_same_values_are_byte_identical(values_file: Path | None) -> None:
    """Nothing random or time-dependent: GitOps tools see no diff and pods no checksum change."""
    values = values_of(values_file)
    first, second = manifests(values), manifests(values)
    assert first == second
    deployment = yaml.safe_load(first["edgefl-coordinator/templates/deployment.yaml"])
    assert "checksum/secret" in deployment["spec"]["template"]["metadata"]["annotations"]


def test_a_first_install_with_the_bundled_broker_must_name_the_password() -> None:
    with pytest.raises(helm.HelmError, match=r"broker\.password is required.*broker\.existingSecret\.name"):
        render({}, complete=False)
    # Either one is enough; an external broker needs neither, client certificates neither.
    assert render({"broker": {"existingSecret": {"name": "mine"}}}, complete=False).maybe(
        "Secret", f"{FULLNAME}-broker") is None
    assert render({"mosquitto": {"enabled": False}, "broker": {"url": "mqtt://b:1883"}}, complete=False).maybe(
        "Secret", f"{FULLNAME}-broker") is None
    assert render(values_of(CHART / "ci" / "client-certificate-values.yaml"), complete=False)


def test_the_given_password_changes_the_pods_checksum() -> None:
    """The checksum follows the Secret's content, so a new password restarts both pods."""
    def checksums(password: str) -> list[str]:
        rendered = render({"broker": {"password": password}})
        return [rendered.get("Deployment", name)["spec"]["template"]["metadata"]["annotations"][key]
                for name, key in ((FULLNAME, "checksum/secret"), (BROKER, "checksum/coordinator"))]
    assert all(a != b for a, b in zip(checksums("one"), checksums("two"), strict=True))


# --- coordinator.settings against the coordinator's settings ------------------------------------


def test_the_schema_of_coordinator_config_matches_the_settings_model() -> None:
    """scripts/chart_config_schema.py writes it; rerun it when CoordinatorSettings changes."""
    script = _schema_script()
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema == script.with_config_schema(schema), "run PYTHONPATH=. python scripts/chart_config_schema.py"
    config = schema["properties"]["coordinator"]["properties"]["config"]
    assert config["additionalProperties"] is False
    assert config["properties"]["rounds"] == {"type": "integer", "minimum": 1, "maximum": 1_000_000,
                                              "description": "training rounds to run"}
    assert config["properties"]["state_compression"]["enum"] == ["none", "fp16"]
    assert config["properties"]["log_level"]["enum"] == ["DEBUG", "INFO", "WARNING", "ERROR"]
    assert config["properties"]["batch_size"]["type"] == ["integer", "null"]


def test_every_setting_the_chart_writes_is_in_the_schema() -> None:
    config = yaml.safe_load(render().get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"])
    known = json.loads((CHART / "values.schema.json").read_text())["properties"]["coordinator"]["properties"][
        "config"]["properties"]
    assert set(config) <= set(known)


@pytest.mark.parametrize(("config", "message"), [
    ({"rounds": -1}, "at '/coordinator/config/rounds': minimum: got -1, want 1"),
    ({"roundz": 5}, "additional properties 'roundz' not allowed"),
    ({"aggregator": "average"}, "/coordinator/config/aggregator"),
    ({"quorum_fraction": 0}, "/coordinator/config/quorum_fraction"),
    ({"trim_beta": 0.5}, "/coordinator/config/trim_beta"),
    ({"learning_rate": "fast"}, "/coordinator/config/learning_rate"),
    ({"max_message_bytes": 100}, "/coordinator/config/max_message_bytes"),
    ({"compression": "zip"}, "/coordinator/config/compression"),
    ({"client_id": "a b"}, "/coordinator/config/client_id"),
    ({"evaluate_final": "yes"}, "/coordinator/config/evaluate_final"),
])
def test_bad_coordinator_settings_fail_at_render_naming_them(config: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message.replace("(", r"\(")):
        render({"coordinator": {"config": config}})


def test_settings_of_every_type_pass_the_schema_and_load_in_the_coordinator(tmp_path: Path) -> None:
    config = {"algorithm": "fedprox", "aggregator": "trimmed_mean", "trim_beta": 0.2, "batch_size": 16,
              "clip_norm": 5.0, "compression": "topk:0.01", "momentum": 0, "mode": "async", "buffer_size": 20,
              "max_message_bytes": 131072, "client_id": "coordinator-a", "evaluate_final": False}
    text = render({"coordinator": {"config": config}}).get("ConfigMap", FULLNAME)["data"]["coordinator.yaml"]
    (tmp_path / "c.yaml").write_text(text)
    settings = load_settings(CoordinatorSettings, tmp_path / "c.yaml")
    assert {k: getattr(settings, k) for k in config} == config


# --- pods: pull secrets, extra volumes and environment ---------------------------------------


def test_image_pull_secrets_are_on_every_pod() -> None:
    rendered = render({"imagePullSecrets": [{"name": "registry-credentials"}],
                       "global": {"imagePullSecrets": [{"name": "shared"}, {"name": "registry-credentials"}]}})
    pods = _pods(rendered)
    assert set(pods) == {FULLNAME, BROKER, f"{FULLNAME}-test"}
    for name, pod in pods.items():
        assert pod["imagePullSecrets"] == [{"name": "shared"}, {"name": "registry-credentials"}], name
    assert all("imagePullSecrets" not in pod for pod in _pods(render()).values())


def test_extra_volumes_mounts_and_env_from_reach_the_coordinator() -> None:
    rendered = render(values_of(CHART / "ci" / "network-policy-values.yaml"))
    spec = rendered.get("Deployment", FULLNAME)["spec"]["template"]["spec"]
    coordinator = container(rendered.get("Deployment", FULLNAME), "coordinator")
    assert {"name": "site-ca", "configMap": {"name": "site-ca-bundle"}} in spec["volumes"]
    assert {"name": "site-ca", "mountPath": "/etc/site-ca", "readOnly": True} in coordinator["volumeMounts"]
    assert coordinator["envFrom"] == [{"configMapRef": {"name": "site-settings"}},
                                      {"secretRef": {"name": "site-secrets"}, "prefix": "SITE_"}]
    assert {m["mountPath"] for m in coordinator["volumeMounts"]} >= {"/etc/edgefl", "/var/lib/edgefl", "/tmp"}
    plain = container(render().get("Deployment", FULLNAME), "coordinator")
    assert "envFrom" not in plain and "/etc/site-ca" not in {m["mountPath"] for m in plain["volumeMounts"]}


@pytest.mark.parametrize(("coordinator", "message"), [
    ({"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}, 'coordinator.extraVolumes: the name "tmp"'),
    ({"extraVolumes": [{"name": "x", "emptyDir": {}}], "extraVolumeMounts": [{"name": "x", "mountPath": "/tmp"}]},
     "coordinator.extraVolumeMounts: /tmp is where the chart mounts"),
    ({"extraVolumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}, '"nowhere" names no volume'),
    ({"extraVolumeMounts": [{"name": "x", "mountpath": "/x"}]}, "/coordinator/extraVolumeMounts/0"),
    ({"extraVolumes": [{"name": "Bad_Name", "emptyDir": {}}]}, "/coordinator/extraVolumes/0/name"),
    ({"extraEnvFrom": [{"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}]}, "/coordinator/extraEnvFrom/0"),
    ({"extraEnvFrom": [{"secret": {"name": "s"}}]}, "/coordinator/extraEnvFrom/0"),
])
def test_bad_extras_fail_naming_the_value(coordinator: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render({"coordinator": coordinator})


# --- NetworkPolicies --------------------------------------------------------------------------


def _rule_ports(rule: dict[str, Any]) -> list[tuple[int, str]]:
    return [(p["port"], p["protocol"]) for p in rule["ports"]]


def test_no_network_policy_unless_enabled() -> None:
    assert not render().all("NetworkPolicy")


def test_network_policies_confine_the_coordinator_and_the_broker() -> None:
    rendered = render(values_of(CHART / "ci" / "network-policy-values.yaml"))
    assert {p["metadata"]["name"] for p in rendered.all("NetworkPolicy")} == {FULLNAME, BROKER}

    coordinator = rendered.get("NetworkPolicy", FULLNAME)["spec"]
    assert coordinator["podSelector"]["matchLabels"] == COORDINATOR_LABELS
    assert coordinator["policyTypes"] == ["Ingress", "Egress"]
    # In: the HTTP port only, from the monitoring namespace and the helm test pod.
    [ingress] = coordinator["ingress"]
    assert _rule_ports(ingress) == [(9100, "TCP")]
    assert ingress["from"] == [{"podSelector": {"matchLabels": TEST_POD_LABELS}},
                               {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    # Out: the broker's pods on its MQTT port, and DNS.
    to_broker, dns = coordinator["egress"]
    assert _rule_ports(to_broker) == [(1883, "TCP")]
    assert to_broker["to"] == [{"podSelector": {"matchLabels": BROKER_LABELS}}]
    assert _rule_ports(dns) == [(53, "UDP"), (53, "TCP")]
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}

    broker = rendered.get("NetworkPolicy", BROKER)["spec"]
    assert broker["podSelector"]["matchLabels"] == BROKER_LABELS
    assert broker["policyTypes"] == ["Ingress", "Egress"] and "egress" not in broker  # it opens no connection
    [mqtt] = broker["ingress"]
    assert _rule_ports(mqtt) == [(1883, "TCP")]
    assert mqtt["from"] == [{"podSelector": {"matchLabels": COORDINATOR_LABELS}},
                            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge-agents"}}},
                            {"ipBlock": {"cidr": "10.20.0.0/16"}}]
    # The selectors pick the pods the chart runs.
    for policy, name in ((coordinator, FULLNAME), (broker, BROKER)):
        labels = rendered.get("Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    test_pod = rendered.get("Pod", f"{FULLNAME}-test")["metadata"]["labels"]
    assert TEST_POD_LABELS.items() <= test_pod.items()
    assert "NetworkPolicies confine the coordinator" in rendered.notes
    assert "networkPolicy.agents.from is empty" not in rendered.notes


def test_network_policies_follow_tls_and_an_external_broker() -> None:
    tls = render({"networkPolicy": {"enabled": True, "agents": {"from": []}, "metrics": {"from": []}},
                  "mosquitto": {"tls": {"enabled": True, "existingSecret": "t"}}})
    [mqtts] = tls.get("NetworkPolicy", BROKER)["spec"]["ingress"]
    assert _rule_ports(mqtts) == [(8883, "TCP")] and "from" not in mqtts  # empty `from`: any source, this port
    coordinator = tls.get("NetworkPolicy", FULLNAME)["spec"]
    assert _rule_ports(coordinator["egress"][0]) == [(8883, "TCP")]
    assert "from" not in coordinator["ingress"][0]

    external = render({"networkPolicy": {"enabled": True, "externalBroker": {"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}]}},
                       "mosquitto": {"enabled": False}, "broker": {"url": "mqtts://mqtt.example.com"}})
    assert [p["metadata"]["name"] for p in external.all("NetworkPolicy")] == [FULLNAME]
    to_broker = external.get("NetworkPolicy", FULLNAME)["spec"]["egress"][0]
    assert _rule_ports(to_broker) == [(8883, "TCP")] and to_broker["to"] == [{"ipBlock": {"cidr": "203.0.113.7/32"}}]
    port = render({"networkPolicy": {"enabled": True}, "mosquitto": {"enabled": False},
                   "broker": {"url": "mqtt://10.0.0.5:11883"}}).get("NetworkPolicy", FULLNAME)["spec"]["egress"][0]
    assert _rule_ports(port) == [(11883, "TCP")] and "to" not in port


@pytest.mark.parametrize(("values", "message"), [
    ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
    ({"networkPolicy": {"agents": {"from": [{"namespaceSelecter": {}}]}}}, "/networkPolicy/agents/from/0"),
    ({"networkPolicy": {"agents": {"from": [{"ipBlock": {"cdr": "10.0.0.0/8"}}]}}}, "/networkPolicy/agents/from/0"),
    ({"networkPolicy": {"dns": {"to": [{}]}}}, "/networkPolicy/dns/to/0"),
    ({"broker": {"url": "mqtt://user:secret@broker:1883"}}, "/broker/url"),
])
def test_bad_network_values_fail_naming_them(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


# --- NOTES ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "address"), [
    ({}, f"mqtt://<broker address>:1883, where <broker address> is\n{BROKER}.{NAMESPACE}.svc"),
    ({"mosquitto": {"tls": {"enabled": True, "existingSecret": "t", "port": 8884},
                    "service": {"type": "LoadBalancer"}}},
     f"mqtts://<broker address>:8884 (TLS), where <broker address> is\nthe load balancer's address:\n"
     f"  kubectl -n {NAMESPACE} get svc {BROKER}"),
    ({"mosquitto": {"service": {"type": "NodePort"}}}, "a node's address, on the node port instead of 1883"),
    ({"mosquitto": {"enabled": False}, "broker": {"url": "mqtts://mqtt.example.com:8883", "username": "u"}},
     "Agents connect to the same broker: --broker-url mqtts://mqtt.example.com:8883"),
])
def test_notes_give_agents_the_scheme_address_and_port_and_no_secret(values: dict[str, Any], address: str) -> None:
    values = {**values, "broker": {**values.get("broker", {}), "password": "s3cret-coordinator-pw"},
              "mosquitto": {**values.get("mosquitto", {}), "agents": [{"username": "a-1", "password": "s3cret-agent"}]}}
    notes = render(values).notes
    assert address in notes, notes
    assert "s3cret" not in notes
