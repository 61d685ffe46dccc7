"""The Grafana dashboards and alert rules, read statically: datasource, rate windows, metric names,
every exported metric on a panel (or left out on purpose), and a runbook section per alert.

The live check (a real Prometheus evaluating every query) is
tests/integration/test_prometheus.py; this one names the metric or panel that went wrong.
The process_* metrics come from /proc: like the deployment, these tests assume Linux.
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

from coordinator.telemetry.heterogeneity import HeterogeneityMetrics, LabelSkew
from coordinator.telemetry.metrics import CoordinatorMetrics
from tests.chart import REPO

DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
ALERTS = REPO / "dashboards" / "alerts.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"
METRIC = re.compile(r"\b(?:fl|process|python)_[a-z0-9_]+\b")
RECORDED = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")  # level:metric:operation
RANGE = re.compile(r"\[([^\]]+)\]")

# Exported, yet on no panel of the dashboard, each for a reason. A name a panel starts to show
# must leave this list; a metric the coordinator starts to export must join a panel or the list.
NOT_ON_A_PANEL = {
    # Same information as a panel's metric.
    "fl_checkpoint_last_timestamp_seconds": "the age panel shows now minus this (fl_checkpoint_age_seconds)",
    "fl_round_phase_seconds_sum": "the phase panel shows the median from the buckets; the sum only adds a mean",
    "fl_round_phase_seconds_count": "one observation per phase and round: fl_rounds_total counts the same rounds",
    "fl_update_staleness_versions_sum": "the staleness panel shows quantiles from the buckets",
    "fl_update_staleness_versions_count": "one per accepted update: fl_updates_total{outcome=\"accepted\"}",
    # Runtime internals, for an investigation the memory and CPU panels start; query them ad hoc.
    "process_virtual_memory_bytes": "address space, not memory use: numpy and torch map far more than they touch",
    "python_gc_objects_collected_total": "garbage-collector internals",
    "python_gc_objects_uncollectable_total": "garbage-collector internals",
    "python_gc_collections_total": "garbage-collector internals",
}


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


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def records() -> dict[str, str]:
    return {r["record"]: r["expr"] for r in rules() if "record" in r}


def metrics_read(expr: str) -> set[str]:
    """The exported metrics an expression reads, through the recording rules it reads."""
    recorded = records()
    names: set[str] = set()
    for name in RECORDED.findall(expr):
        assert name in recorded, f"{name} is recorded by no rule of {ALERTS.name}"
        names |= metrics_read(recorded[name])
    return names | set(METRIC.findall(RECORDED.sub("", expr)))


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
            names = metrics_read(expr)
            assert names and names <= known, (panel["title"], names - known)
            used |= names
    # What the issue asks the dashboard to show.
    assert {"fl_rounds_total", "fl_round_duration_seconds_bucket", "fl_round_agents", "fl_round_bytes",
            "fl_received_bytes_total", "fl_sent_bytes_total", "fl_messages_rejected_total",
            "fl_federated_accuracy_ratio", "fl_federated_loss", "fl_privacy_epsilon"} <= used
    titles = [p["title"] for p in panels(dashboard)]
    assert len(titles) == len(set(titles))


def test_every_exported_metric_is_on_a_panel_or_left_out_on_purpose() -> None:
    exported = exported_names()
    shown = {name for path in DASHBOARDS for panel in panels(json.loads(path.read_text()))
             for target in panel["targets"] for name in metrics_read(target["expr"])}
    left_out = set(NOT_ON_A_PANEL)
    unshown, shown_anyway, gone = exported - shown - left_out, left_out & shown, left_out - exported
    assert not unshown, f"add a panel, or a reason to NOT_ON_A_PANEL: {sorted(unshown)}"
    assert not shown_anyway, f"on a panel now, remove from NOT_ON_A_PANEL: {sorted(shown_anyway)}"
    assert not gone, f"no longer exported, remove from NOT_ON_A_PANEL: {sorted(gone)}"


def test_the_edge_agent_exports_no_metrics() -> None:
    """Only the coordinator serves /metrics. An agent that starts to export metrics needs them in
    exported_names(), and so on the dashboard or in NOT_ON_A_PANEL."""
    exporting = [p.name for p in (REPO / "edge_agent").rglob("*.py") if "prometheus_client" in p.read_text()]
    assert exporting == []


def test_alert_rules_use_real_metrics() -> None:
    alerts = [r for r in rules() if "alert" in r]
    assert {r["alert"] for r in alerts} >= {"EdgeflCoordinatorDown", "EdgeflCoordinatorAbsent",
                                           "EdgeflFederationStalled", "EdgeflQuorumMissedRepeatedly",
                                           "EdgeflRejectedUpdatesFlood", "EdgeflBrokerDisconnected"}
    known = exported_names()
    for rule in rules():
        names = metrics_read(rule["expr"])
        assert names and names <= known, (rule.get("alert") or rule["record"], names - known)


def test_every_recording_rule_is_read_and_named_for_what_it_keeps() -> None:
    """level:metric:operation, "instance" level: the target's labels survive (panels filter and sum by them)."""
    readers = [r["expr"] for r in rules()] + [t["expr"] for path in DASHBOARDS
                                              for p in panels(json.loads(path.read_text())) for t in p["targets"]]
    for name, expr in records().items():
        level, metric, operation = name.split(":")
        assert level == "instance" and operation == "rate5m" and "[5m]" in expr, name
        assert metric in expr and "by (" not in expr, (name, "aggregates away target labels")
        assert any(name in reader for reader in readers), f"{name} is read by no panel or rule"


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_its_own_runbook_section() -> None:
    text = RUNBOOK.read_text()
    sections = [github_anchor(h) for h in re.findall(r"^## (.+)$", text, re.MULTILINE)]
    alerts = [r for r in rules() if "alert" in r]
    for rule in alerts:
        url = rule["annotations"].get("runbook_url", "")
        assert url == f"docs/runbook.md#{github_anchor(rule['alert'])}", (rule["alert"], url)
        assert url.split("#")[1] in sections, (rule["alert"], "no such section in docs/runbook.md")
    assert sorted(sections) == sorted(github_anchor(r["alert"]) for r in alerts), "one section per alert"
    for target in re.findall(r"\]\(#([^)]+)\)", text):
        assert target in sections, f"runbook link to a missing section: #{target}"


def test_promtool_accepts_the_rules_and_they_fire_as_intended() -> None:
    """promtool (Debian's prometheus package) checks the file, then runs alert_cases.yaml: every alert
    fires in some case there, and the cases cover the recording rules."""
    cases = Path(__file__).parent / "alert_cases.yaml"
    tested = yaml.safe_load(cases.read_text())["tests"]
    fired = {t["alertname"] for case in tested for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert fired == {r["alert"] for r in rules() if "alert" in r}
    assert {t["expr"] for case in tested for t in case.get("promql_expr_test", [])} >= {
        "instance:fl_messages_rejected:rate5m", "instance:fl_received_messages:rate5m"}
    check = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run(["promtool", "test", "rules", cases.name], cwd=cases.parent, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
