"""The Helm chart, rendered offline with helm-python-sdk (no helm binary), as Kubernetes objects."""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "edgefl-coordinator"
RELEASE = "fl"
NAMESPACE = "edge"
FULLNAME = f"{RELEASE}-edgefl-coordinator"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
"""The chart's CI values files (each states what it covers); the defaults come on top."""


def values_of(path: Path | None) -> dict[str, Any]:
    return {} if path is None else (yaml.safe_load(path.read_text()) or {})


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    notes: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def maybe(self, kind: str, name: str) -> dict[str, Any] | None:
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert len(found) <= 1, f"{len(found)} {kind}s named {name}"
        return found[0] if found else None

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = self.maybe(kind, name)
        assert found is not None, f"no {kind} {name} among {[(o['kind'], o['metadata']['name']) for o in self.objects]}"
        return found

    def secret_value(self, name: str, key: str) -> str:
        secret = self.get("Secret", name)
        if key in secret.get("stringData", {}):
            return str(secret["stringData"][key])
        return base64.b64decode(secret["data"][key]).decode()


FIRST_INSTALL_PASSWORD = "chart-test-coordinator-password"
"""broker.password for renders that give none: with the bundled broker a first install must name
it (offline there is no earlier Secret to look up), as users must."""


def with_required(values: dict[str, Any] | None) -> dict[str, Any]:
    """`values` plus broker.password where the chart requires one and `values` give neither it nor a Secret."""
    values = copy.deepcopy(values or {})
    broker = values.get("broker", {})
    mosquitto = values.get("mosquitto", {})
    tls = mosquitto.get("tls", {})
    certificates_only = tls.get("enabled") and tls.get("requireClientCertificate") and not mosquitto.get(
        "plaintextListener")
    if (mosquitto.get("enabled", True) and not certificates_only and not broker.get("password")
            and not broker.get("existingSecret", {}).get("name")):
        values.setdefault("broker", {})["password"] = FIRST_INSTALL_PASSWORD
    return values


def manifests(values: dict[str, Any] | None = None, *, complete: bool = True) -> dict[str, str]:
    """The rendered files by template path, as `helm template` writes them (NOTES.txt included)."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=with_required(values) if complete else (values or {}), name=RELEASE,
                            namespace=NAMESPACE, is_install=True)


def render(values: dict[str, Any] | None = None, *, complete: bool = True) -> Rendered:
    """The chart rendered with `values` (completed by with_required unless `complete` is False)."""
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests(values, complete=complete).items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return Rendered(objects, notes)


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    found = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    assert len(found) == 1, f"container {name} in {deployment['metadata']['name']}"
    return found[0]
