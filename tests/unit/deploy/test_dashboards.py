"""The Grafana dashboards and alert rules, read statically: datasource, rate windows, metric names.

The live check (a real Prometheus evaluating every query) is
tests/integration/test_prometheus.py; this one names the metric or panel that went wrong.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from coordinator.heterogeneity import HeterogeneityMetrics, LabelSkew
from coordinator.metrics import CoordinatorMetrics
from tests.chart import REPO

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
ALERTS = REPO / "dashboards" / "alerts.yaml"
METRIC = re.compile(r"\bfl_[a-z0-9_]+\b")
RANGE = re.compile(r"\[([^\]]+)\]")


def exported_names() -> set[str]:
    """Every sample name the coordinator can export, labelled children included."""
    names: set[str] = set()
    registry = CollectorRegistry()
    CoordinatorMetrics(registry)
    HeterogeneityMetrics(registry).update(LabelSkew(3), temperature=1.0)  # the engine registers these too
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "info": ["_info"]}
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    flat = []
    for panel in dashboard["panels"]:
        flat.append(panel)
        flat += panel.get("panels", [])
    return [p for p in flat if p["type"] != "row"]


def test_there_is_a_dashboard() -> None:
    assert [p.name for p in DASHBOARDS] == ["edgefl-coordinator.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_uses_the_datasource_variable_everywhere(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] == path.stem
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    text = path.read_text()
    uids = set(re.findall(r'"uid":\s*"([^"]*)"', text))
    assert uids == {path.stem, "${datasource}"}, "a hard-coded datasource uid"
    for panel in panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_queries_use_rate_interval_and_real_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    known = exported_names()
    used: set[str] = set()
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = target["expr"]
            assert RANGE.findall(expr) in ([], ["$__rate_interval"] * len(RANGE.findall(expr))), (panel["title"], expr)
            assert 'job="$job"' in expr and 'instance=~"$instance"' in expr, (panel["title"], expr)
            names = set(METRIC.findall(expr))
            assert names and names <= known, (panel["title"], names - known)
            used |= names
    # What the issue asks the dashboard to show.
    assert {"fl_rounds_total", "fl_round_duration_seconds_bucket", "fl_round_agents", "fl_round_bytes",
            "fl_received_bytes_total", "fl_sent_bytes_total", "fl_messages_rejected_total",
            "fl_federated_accuracy_ratio", "fl_federated_loss", "fl_privacy_epsilon"} <= used
    titles = [p["title"] for p in panels(dashboard)]
    assert len(titles) == len(set(titles))


def test_alert_rules_use_real_metrics() -> None:
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {"EdgeflFederationStalled", "EdgeflQuorumMissedRepeatedly",
                                           "EdgeflRejectedUpdatesFlood"}
    known = exported_names()
    for rule in rules:
        names = set(METRIC.findall(rule["expr"]))
        assert names and names <= known, (rule["alert"], names - known)


def test_promtool_accepts_the_rules_and_they_fire_as_intended() -> None:
    """promtool (Debian's prometheus package) checks the file, then runs alert_cases.yaml."""
    check = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    cases = Path(__file__).parent / "alert_cases.yaml"
    run = subprocess.run(["promtool", "test", "rules", cases.name], cwd=cases.parent, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
