"""The site chart (helm/edgefl-site): a site aggregator and a site Mosquitto bridged to the root broker.

Rendered offline with the bundled Helm (helm-python-sdk), as `helm template` would: every object
validates against the Kubernetes schemas, the values schema refuses bad values, the bridge carries
exactly the topics of deploy/mosquitto/site-bridge.conf (agents' updates stay at the site), the ACL
is deploy/mosquitto/site-acl, and the aggregator's command line resolves to the right settings.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from coordinator.app.cli import app as coordinator_app
from coordinator.sites.settings import SiteSettings
from launcher.sites import bridge_topics
from service_kit.settings import load_settings
from tests.chart import REPO, Rendered, container
from tests.unit.deploy.test_device_deploy import parse_args

CHART = REPO / "helm" / "edgefl-site"
RELEASE, NAMESPACE = "farm", "edge"
FULLNAME = f"{RELEASE}-edgefl-site"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
IDS = [p.name.removesuffix("-values.yaml") for p in VALUES_FILES]
KUBE_VERSIONS = ("1.25", kubernetes_validate.utils.latest_version())
MINIMAL: dict[str, Any] = {
    "siteId": "site-a", "root": {"host": "root-broker.fl.svc", "password": "bridge-pw"},
    "aggregator": {"password": "aggregator-pw", "credentials": {
        "signingKey": "PEM\n", "coordinatorKey": "ed25519:AAAA", "enrolledAgents": "{}"}},
    "mosquitto": {"agents": [{"username": "rpi-1", "password": "rpi-1-pw"}]},
}


def values_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict[str, Any]) -> Rendered:
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = [doc for path, text in sorted(files.items()) if not path.endswith("NOTES.txt")
               for doc in yaml.safe_load_all(text) if doc]
    return Rendered(objects, files.get("edgefl-site/templates/NOTES.txt", ""))


def conf_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=IDS)
def test_lint_reports_no_errors_or_warnings(values_file: Path) -> None:
    report = helm.lint(CHART, values_of(values_file), namespace=NAMESPACE, kube_version="v1.30.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=IDS)
def test_every_object_validates_and_every_container_is_locked_down(values_file: Path) -> None:
    rendered = render(values_of(values_file))
    assert {o["kind"] for o in rendered.objects} >= {"Deployment", "Service", "ConfigMap"}
    for obj in rendered.objects:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"]["namespace"] == NAMESPACE
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for deployment in rendered.all("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["capabilities"]["drop"]) == (
                True, False, ["ALL"]), c["name"]
            assert "memory" in c["resources"]["limits"], c["name"]


@pytest.mark.parametrize("bad", [
    {"siteId": "a/b"},                                  # not an identifier: it would escape its topic
    {"siteId": ""},                                     # required
    {"root": {"host": ""}},                             # required
    {"root": {"port": 70000}},
    {"aggregator": {"deadlineFraction": 1.0}},          # the site must close before the root does
    {"aggregator": {"config": {"site_id": "other"}}},   # the chart sets it
    {"aggregator": {"credentials": {"coordinatorKey": "not-a-key"}}},
    {"mosquitto": {"agents": [{"username": "x"}]}},     # no password
    {"mosquitto": {"maxPacketSize": 300_000_000}},      # above MQTT's limit
    {"unknownKey": 1},
])
def test_the_schema_refuses_bad_values(bad: dict[str, Any]) -> None:
    values = yaml.safe_load(yaml.safe_dump(MINIMAL))
    for key, value in bad.items():
        values[key] = {**values[key], **value} if isinstance(value, dict) and key in values else value
    with pytest.raises(Exception, match=r"(?i)schema|required"):
        render(values)


def test_secrets_left_out_fail_with_a_clear_message() -> None:
    for key, message in (("root", "root.password"), ("aggregator", "aggregator.password")):
        values = yaml.safe_load(yaml.safe_dump(MINIMAL))
        values[key].pop("password")
        with pytest.raises(Exception, match=re.escape(message)):
            render(values)


@pytest.mark.parametrize("federation", ["default", "greenhouse"])
def test_the_bridge_carries_the_site_bridge_conf_topics_and_not_the_updates(federation: str) -> None:
    rendered = render({**MINIMAL, "federation": federation})
    data = rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]
    bridge = conf_lines(data["bridge.conf"])
    topics = [line for line in bridge if line.startswith("topic ")]
    assert topics == bridge_topics(federation)
    shipped = [line.replace("FEDERATION", federation) for line in conf_lines(
        (REPO / "deploy" / "mosquitto" / "site-bridge.conf").read_text()) if line.startswith("topic ")]
    assert topics == shipped
    direction = {line.split()[1].removeprefix(f"fl/{federation}/"): line.split()[2] for line in topics}
    assert {t for t, d in direction.items() if d == "in"} == {
        "coordinator/status", "rounds/current", "task", "global/#", "notices/#", "sites/+/resync"}
    assert {t for t, d in direction.items() if d == "out"} == {"sites/+/roster", "sites/+/partials/#"}
    assert not any(t.startswith(("updates", "agents", "#")) for t in direction), \
        "agents' updates and statuses stay at the site"
    assert ("cleansession false" in bridge and "address root-broker.fl.svc:1883" in bridge
            and "remote_username site-a-bridge" in bridge and "remote_clientid site-site-a-bridge" in bridge)
    assert not any(line.startswith(("remote_password", "bridge_cafile")) for line in bridge)
    # mosquitto.conf takes the bridge in (with its password, added by the init container) from the bridge volume.
    mosquitto = rendered.get("Deployment", f"{FULLNAME}-mosquitto")
    include = [line.split()[1] for line in conf_lines(data["mosquitto.conf"]) if line.startswith("include_dir")]
    mounts = {m["mountPath"]: m["name"] for m in container(mosquitto, "mosquitto")["volumeMounts"]}
    assert include == ["/mosquitto/bridge"] and mounts["/mosquitto/bridge"] == "bridge"
    script = container(mosquitto, "credentials")["command"][-1]
    assert "cp /mosquitto/config/bridge.conf /mosquitto/bridge/bridge.conf" in script
    assert "remote_password %s" in script and "bridge-pw" not in str(data)


def test_the_bridge_over_tls_verifies_the_root_with_its_ca() -> None:
    rendered = render({**MINIMAL, "root": {**MINIMAL["root"], "port": 8883, "username": "bridge-7",
                                            "tls": {"enabled": True, "caSecret": "root-ca", "caKey": "ca.pem"}}})
    bridge = conf_lines(rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["bridge.conf"])
    assert {"address root-broker.fl.svc:8883", "remote_username bridge-7", "bridge_cafile /mosquitto/root-ca/ca.crt"} <= set(bridge)
    pod = rendered.get("Deployment", f"{FULLNAME}-mosquitto")["spec"]["template"]["spec"]
    ca = next(v for v in pod["volumes"] if v["name"] == "root-ca")["secret"]
    assert ca == {"secretName": "root-ca", "items": [{"key": "ca.pem", "path": "ca.crt"}]}


def test_devices_reach_the_site_broker_over_tls_alone_when_it_is_on() -> None:
    """The device-facing Service carries the TLS port only; the plaintext listener stays for the aggregator on an
    internal ClusterIP Service; without TLS the notes warn of passwords and updates in clear."""
    plain = render({**MINIMAL, "mosquitto": {**MINIMAL["mosquitto"], "service": {"type": "LoadBalancer"}}})
    assert "WARNING: the site broker listens without TLS" in plain.notes
    assert "WARNING: the bridge to the root broker runs without TLS" in plain.notes
    rendered = render({**MINIMAL, "mosquitto": {**MINIMAL["mosquitto"], "service": {"type": "LoadBalancer"},
                                                "tls": {"enabled": True, "existingSecret": "site-tls"}}})
    assert "listens without TLS" not in rendered.notes and ":8883 (agents connect here, over TLS" in rendered.notes
    outside = rendered.get("Service", f"{FULLNAME}-mosquitto")["spec"]
    assert outside["type"] == "LoadBalancer" and [p["port"] for p in outside["ports"]] == [8883]
    inside = rendered.get("Service", f"{FULLNAME}-mosquitto-internal")["spec"]
    assert inside["type"] == "ClusterIP" and [p["port"] for p in inside["ports"]] == [1883]
    conf = conf_lines(rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["mosquitto.conf"])
    tls = conf.index("listener 8883")
    assert conf[tls + 1:tls + 4] == ["certfile /mosquitto/tls/tls.crt", "keyfile /mosquitto/tls/tls.key",
                                     "use_username_as_clientid true"]
    pod = rendered.get("Deployment", f"{FULLNAME}-mosquitto")["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "tls")["secret"]["secretName"] == "site-tls"
    with pytest.raises(Exception, match="mosquitto.tls.existingSecret is required"):
        render({**MINIMAL, "mosquitto": {**MINIMAL["mosquitto"], "tls": {"enabled": True}}})


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=IDS)
def test_the_acl_is_the_shipped_site_acl(values_file: Path) -> None:
    values = values_of(values_file)
    federation, site = values.get("federation", "default"), values["siteId"]
    acl = render(values).get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["acl"]
    shipped = [line.replace("fl/default/", f"fl/{federation}/").replace("SITE_ID", site)
               for line in conf_lines((REPO / "deploy" / "mosquitto" / "site-acl").read_text())]
    assert conf_lines(acl) == shipped
    rules = [line.split() for line in conf_lines(acl)]
    aggregator = [r for r in rules[1:] if r[0] == "topic"]
    assert rules[0] == ["user", "site-aggregator"] and len(aggregator) == len(rules) - 1 - 10
    assert ["topic", "read", f"fl/{federation}/updates/#"] in aggregator
    assert [r for r in aggregator if r[1] != "read"] == [["topic", "write", f"fl/{federation}/sites/{site}/roster"],
                                                         ["topic", "write", f"fl/{federation}/sites/{site}/partials/#"],
                                                         ["topic", "write", f"fl/{federation}/secagg_relay/#"],
                                                         ["topic", "write", f"fl/{federation}/secagg_inbox/#"]]
    patterns = [r for r in rules if r[0] == "pattern"]
    assert ["pattern", "read", f"fl/{federation}/secagg_inbox/%c/#"] in patterns  # its own bundles, no one else's
    assert all(r[2].startswith(f"fl/{federation}/") for r in rules[1:])
    assert not any("sites/" in r[2] for r in patterns), "no agent may publish a site's partial"
    assert not any(r[1] == "read" and "updates" in r[2] for r in patterns), "no agent reads another's update"


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=IDS)
def test_the_aggregators_command_line_resolves_to_the_sites_settings(
        values_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = values_of(values_file)
    rendered = render(values)
    deployment = rendered.get("Deployment", FULLNAME)
    aggregator = container(deployment, "aggregator")
    args = aggregator["args"]
    assert args[0] == "site" and aggregator.get("command") is None  # the image's entrypoint is `coordinator`
    options = parse_args(coordinator_app, args)
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in aggregator["volumeMounts"]}

    # The config file is the ConfigMap's, and the key files come from the credentials Secret.
    config = Path(options.pop("config"))
    (tmp_path / "site.yaml").write_text(rendered.get("ConfigMap", FULLNAME)["data"][config.name])
    assert volumes[mounts[str(config)]["name"]]["configMap"]["name"] == FULLNAME
    credentials = volumes[mounts["/etc/edgefl/credentials"]["name"]]["secret"]["secretName"]
    files = [Path(options[k]) for k in ("signing_key_file", "coordinator_key", "enrolled_agents_file")]
    keys = {f.name for f in files}
    assert {str(f.parent) for f in files} == {"/etc/edgefl/credentials"} and len(keys) == 3
    secret = rendered.maybe("Secret", credentials)
    if secret is None:
        assert credentials == values["aggregator"]["credentials"]["existingSecret"]
    else:
        assert set(secret["stringData"]) == keys == {"agent_key.pem", "coordinator.pub", "enrolled.json"}

    for name in [n for n in os.environ if n.startswith("FL_SITE_")]:
        monkeypatch.delenv(name)
    env = {e["name"]: e for e in aggregator["env"]}
    monkeypatch.setenv("FL_SITE_BROKER_PASSWORD", "from-the-secret")
    settings = load_settings(SiteSettings, tmp_path / "site.yaml", options)
    assert settings.site_id == values["siteId"] and settings.federation == values.get("federation", "default")
    # The aggregator takes the plaintext listener inside the cluster: with TLS for devices, on a Service of its own.
    internal = f"{FULLNAME}-mosquitto-internal" if values["mosquitto"].get("tls", {}).get("enabled") else \
        f"{FULLNAME}-mosquitto"
    service = rendered.get("Service", internal)
    assert service["spec"]["type"] == "ClusterIP"
    assert settings.broker_url == f"mqtt://{internal}:{service['spec']['ports'][0]['port']}"
    acl_user = re.search(r"^user (\S+)$", rendered.get("ConfigMap", f"{FULLNAME}-mosquitto")["data"]["acl"], re.M)
    assert acl_user is not None and settings.broker_username == acl_user.group(1)
    assert settings.broker_password is not None and "secretKeyRef" in env["FL_SITE_BROKER_PASSWORD"]["valueFrom"]
    assert settings.site_deadline_fraction == values["aggregator"].get("deadlineFraction", 0.8)
    assert settings.max_update_bytes == values["aggregator"].get("config", {}).get("max_update_bytes", 268435456)
    # The state (held partials) is on the PVC, or an emptyDir without persistence.
    state = volumes[mounts[str(settings.state_dir.parent)]["name"]]
    persistent = values["aggregator"].get("persistence", {}).get("enabled", False)
    assert ("persistentVolumeClaim" in state) == persistent
    assert (rendered.maybe("PersistentVolumeClaim", FULLNAME) is not None) == persistent


def test_no_password_is_in_a_configmap_and_agents_are_in_the_password_secret() -> None:
    rendered = render(MINIMAL)
    for configmap in rendered.all("ConfigMap"):
        assert not any(pw in str(configmap["data"]) for pw in ("bridge-pw", "aggregator-pw", "rpi-1-pw"))
    assert rendered.secret_value(f"{FULLNAME}-agents", "passwd").split() == ["rpi-1:rpi-1-pw"]
    assert rendered.secret_value(f"{FULLNAME}-root", "password") == "bridge-pw"
    notes = rendered.notes
    assert "site-a-bridge" in notes and "coordinator enroll site-a" in notes


def _tls_values() -> dict:
    v = copy.deepcopy(MINIMAL)
    v["mosquitto"]["tls"] = {"enabled": True, "existingSecret": "site-tls"}
    return v


def test_with_tls_the_plaintext_listener_takes_the_aggregator_alone() -> None:
    """Devices get the TLS port alone: the Services route so, and a NetworkPolicy makes the pod hold to it (found in
    review: without one, anything reaching the pod's IP logged in in clear on 1883)."""
    rendered = render(_tls_values())
    conf = next(o for o in rendered.all("ConfigMap") if "mosquitto.conf" in o["data"])["data"]["mosquitto.conf"]
    assert "listener 1883" in conf  # still opened on the pod
    policies = rendered.all("NetworkPolicy")
    restricted = False
    for p in policies:
        labels = p["spec"]["podSelector"].get("matchLabels", {})
        if labels.get("app.kubernetes.io/component") != "mosquitto":
            continue
        for rule in p["spec"].get("ingress", []):
            ports = {port.get("port") for port in rule.get("ports", [])}
            if 1883 in ports and rule.get("from"):
                restricted = all(peer.get("podSelector", {}).get("matchLabels", {}).get(
                    "app.kubernetes.io/component") == "aggregator" for peer in rule["from"])
    assert restricted, "no NetworkPolicy limits the site broker's plaintext port 1883 to the aggregator"
