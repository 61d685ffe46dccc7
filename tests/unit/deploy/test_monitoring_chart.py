"""The chart's monitoring objects: the labels the Prometheus Operator selects them by, and the
alerts' runbook links under a configurable base URL."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from tests.chart import FULLNAME, REPO, render
from tests.unit.deploy.crd_schemas import SCHEMAS

ALERTS = yaml.safe_load((REPO / "dashboards" / "alerts.yaml").read_text())
BASE = "https://git.example.com/edgefl/blob/main/docs/runbook.md"


def monitoring(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    for kind, settings in overrides.items():
        values[kind].update(settings)
    return {"metrics": values}


def alert_rules(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in spec["groups"] for r in g["rules"] if "alert" in r]


def test_kube_prometheus_stacks_release_label_reaches_both_objects() -> None:
    """kube-prometheus-stack selects ServiceMonitors and PrometheusRules by `release: <name>`."""
    selected = {"release": "monitoring"}
    rendered = render(monitoring(serviceMonitor={"labels": selected}, prometheusRule={"labels": selected}))
    for kind in ("ServiceMonitor", "PrometheusRule"):
        labels = rendered.get(kind, FULLNAME)["metadata"]["labels"]
        assert labels["release"] == "monitoring", kind
        assert labels["app.kubernetes.io/component"] == "coordinator", kind  # the chart's own labels stay
    plain = render(monitoring())
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert "release" not in plain.get(kind, FULLNAME)["metadata"]["labels"], kind


def test_runbook_urls_follow_the_configured_base() -> None:
    rule = render(monitoring(prometheusRule={"runbookBaseUrl": BASE})).get("PrometheusRule", FULLNAME)
    jsonschema.validate(rule, SCHEMAS[(rule["apiVersion"], rule["kind"])])
    alerts = alert_rules(rule["spec"])
    assert len(alerts) == len(alert_rules(ALERTS)) >= 6
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{BASE}#{alert['alert'].lower()}"
    # Nothing else changes: put the repository-relative links back and it is dashboards/alerts.yaml.
    for alert in alerts:
        alert["annotations"]["runbook_url"] = alert["annotations"]["runbook_url"].replace(BASE, "docs/runbook.md")
    assert rule["spec"] == ALERTS


def test_without_a_base_the_links_stay_repository_relative() -> None:
    rule = render(monitoring()).get("PrometheusRule", FULLNAME)
    assert {a["annotations"]["runbook_url"] for a in alert_rules(rule["spec"])} == {
        f"docs/runbook.md#{a['alert'].lower()}" for a in alert_rules(ALERTS)}


@pytest.mark.parametrize("base", ["git.example.com/runbook.md", "https://example.com/run book.md",
                                  "https://example.com/runbook.md#top"])
def test_a_runbook_base_that_is_not_a_plain_url_fails_naming_the_field(base: str) -> None:
    with pytest.raises(helm.HelmError, match="/metrics/prometheusRule/runbookBaseUrl"):
        render(monitoring(prometheusRule={"runbookBaseUrl": base}))
