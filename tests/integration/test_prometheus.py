"""A real Prometheus scrapes a live coordinator through a short training run; every dashboard
query and every alert rule evaluates without error, and the dashboard's panels show data.

Grafana's variables are substituted as Grafana would with this Prometheus as its datasource:
$job and $instance from their label_values() queries (instance as "All", the dashboard's
default), $__rate_interval as 4 x the 1s scrape interval.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
import yaml
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.topics import Topics
from tests.chart import REPO
from tests.integration.prometheus import PrometheusServer
from tests.integration.wire import wait_for_rounds, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FEDERATION = "observed"
ROUNDS = 3
JOB = "edgefl"
SCRAPE_S = 1
RATE_INTERVAL = f"{4 * SCRAPE_S}s"
DASHBOARD = REPO / "dashboards" / "edgefl-coordinator.json"
ALERTS = REPO / "dashboards" / "alerts.yaml"
GARBAGE = 5
# Panels of events this healthy run without differential privacy never has: their series are
# labelled by device or reason and appear with the first event, so here they stay empty (their
# queries still have to run without error).
QUIET_PANELS = {"Agent reconnects and restarts", "Agents out of DP budget by device class",
                "Aggregation failures by reason", "Uncompressed updates",
                # plain rounds only here: secure aggregation's stages never run
                "Secure aggregation: stage time", "Secure aggregation: dropouts per stage",
                "Secure aggregation: bytes per stage"}


def grafana_expr(expr: str, variables: dict[str, Any]) -> str:
    """A panel query as Grafana sends it to Prometheus."""
    instance = variables["instance"]
    return (expr.replace("$__rate_interval", RATE_INTERVAL).replace("${datasource}", "")
            .replace('instance=~"$instance"', f'instance=~"{instance}"').replace("$job", variables["job"]))


def has_data(series: list[dict[str, Any]]) -> bool:
    values = [v for s in series for v in (s.get("values") or [s["value"]])]
    return any(not math.isnan(float(v[1])) for v in values)


def scrape_time(prometheus: PrometheusServer) -> float:
    """When Prometheus last scraped the coordinator (the timestamp of its latest sample)."""
    return float(prometheus.query(f'timestamp(fl_run_finished{{job="{JOB}"}})')[0]["value"][1])


def send_garbage(url: str) -> None:
    """Updates that are not msgpack, from a client the coordinator never enrolled: dropped at the gate
    (``unknown_signer``) before anything reads them."""
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="intruder",
                         protocol=paho.MQTTv311)
    host, port = url.removeprefix("mqtt://").split(":")
    client.connect(host, int(port))
    client.loop_start()
    for i in range(GARBAGE):
        client.publish(Topics(FEDERATION).update("intruder", 1), b"\xc1 not an update %d" % i, qos=1).wait_for_publish(10)
    client.disconnect()
    client.loop_stop()


def test_dashboard_and_alerts_on_a_live_coordinator(tmp_path: Path, mosquitto: MosquittoBroker) -> None:
    http_port = free_port()
    agents = [AgentSpec("phone-0", "phone", 0), AgentSpec("rpi-1", "rpi", 1), AgentSpec("phone-2", "phone", 2)]
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, alpha=1.0), {
        "rounds": ROUNDS, "min_available_agents": 3, "min_fit_agents": 3, "local_epochs": 1,
        "http_port": http_port, "exit_when_finished": False,  # stay up to be scraped
    }, federation=FEDERATION)
    with PrometheusServer(tmp_path / "prometheus", {JOB: [f"127.0.0.1:{http_port}"]}, rule_files=[ALERTS],
                          interval_s=SCRAPE_S) as prometheus:
        start = time.time()
        fleet.start_coordinator()
        try:
            # Agents only once Prometheus holds a sample from before the first round: however fast the
            # rounds then run, every counter and histogram is seen to rise.
            wait_until(lambda: bool(prometheus.query(f'fl_broker_connected{{job="{JOB}"}} == 1')), 120,
                       "Prometheus to scrape a connected coordinator")
            fleet.start_agents()
            send_garbage(mosquitto.url)
            rounds = wait_for_rounds(fleet, ROUNDS + 1, 300)  # the run to finish
            wait_until(lambda: bool(prometheus.query(f'fl_run_finished{{job="{JOB}"}} == 1')), 60,
                       "Prometheus to see the finished run")
            # The rounds may all fall between two scrapes (they take a second here): rate windows
            # need a few scrapes of the final values, so wait for those scrapes, not for time.
            finished_at = scrape_time(prometheus)
            wait_until(lambda: scrape_time(prometheus) >= finished_at + 4 * SCRAPE_S, 60,
                       "four more scrapes of the finished run")
            for recorded in ("fl_round_duration_seconds_count", "fl_aggregation_duration_seconds_count"):
                wait_until(lambda r=recorded: bool(prometheus.query(f'instance:{r}:rate5m{{job="{JOB}"}} > 0')), 60,
                           f"the recording rules to see {recorded} rise")
            end = time.time() + SCRAPE_S  # range queries step from start: one step past what was just seen
            check_dashboard(prometheus, start, end, rounds)
            check_alert_rules(prometheus)
        finally:
            fleet.stop()
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]


def check_dashboard(prometheus: PrometheusServer, start: float, end: float, rounds: list[dict[str, Any]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    templating = {v["name"]: v for v in dashboard["templating"]["list"]}

    # The variables' own queries, as Grafana runs label_values().
    assert templating["job"]["query"] == "label_values(fl_coordinator_info, job)"
    assert prometheus.label_values("job", "fl_coordinator_info") == [JOB]
    instances = prometheus.label_values("instance", f'fl_coordinator_info{{job="{JOB}"}}')
    assert len(instances) == 1
    variables = {"job": JOB, "instance": templating["instance"]["allValue"]}

    results: dict[str, list[list[dict[str, Any]]]] = {}
    panels = [p for row in dashboard["panels"] for p in [row, *row.get("panels", [])] if p["type"] != "row"]
    for panel in panels:
        for target in panel["targets"]:
            expr = grafana_expr(target["expr"], variables)
            if target.get("instant"):
                series = prometheus.query(expr, at=end)
            else:
                series = prometheus.query_range(expr, start, end, step_s=SCRAPE_S)
            results.setdefault(panel["title"], []).append(series)
    empty = [title for title, per_target in results.items() if not any(has_data(s) for s in per_target)]
    assert not set(empty) - QUIET_PANELS, f"panels without data: {empty}"

    def values(title: str, target: int = 0, **labels: str) -> list[float]:
        return [float(v[1]) for s in results[title][target] if labels.items() <= s["metric"].items()
                for v in s.get("values") or [s["value"]] if not math.isnan(float(v[1]))]

    # The process metrics (on Linux) and the recorded rates reach their panels.
    assert min(values("Resident memory")) > 1_000_000
    assert {s["metric"]["implementation"] for s in results["Build"][1]} == {"CPython"}
    assert max(values("Round duration", 0)) > 0  # p50 from instance:fl_round_duration_seconds_bucket:rate5m
    assert values("Share of selected agents answering", 0)[-1] == 1.0
    assert values("Share of selected agents answering", 2)[-1] == 0.0

    completed = [r for r in rounds if r["outcome"] == "completed"]
    assert len(completed) == ROUNDS + 1
    assert values("Round") == [ROUNDS + 1]
    assert values("Run") == [1] and values("Planned rounds") == [ROUNDS]
    assert max(values("Participants vs selected", state="answered")) == 3
    assert max(values("Participants vs selected", state="selected")) == 3
    assert all(0.0 <= v <= 1.0 for v in values("Accuracy by model family"))
    assert {s["metric"]["family"] for s in results["Accuracy by model family"][0]} == {"all", "mlp_tiny", "cnn_small"}
    # Every known reason is exported from the start (at 0), so the first drops show as an increase.
    rejected = {(s["metric"]["kind"], s["metric"]["reason"]) for s in results["Rejected messages by reason, and notices sent"][0]
                if any(float(v[1]) > 0 for v in s["values"])}
    assert rejected == {("update", "unknown_signer")}
    # Garbage from an unknown sender earns no notice: only authenticated agents are told why they were refused.
    assert all(float(v[1]) == 0 for s in results["Rejected messages by reason, and notices sent"][1]
               for v in s["values"])
    assert {s["metric"]["kind"] for s in results["Bytes by message kind"][0]} >= {"update", "agent_status"}
    assert {s["metric"]["kind"] for s in results["Bytes by message kind"][1]} >= {"global_state", "round"}
    assert prometheus.query(f'fl_rounds_total{{job="{JOB}", outcome="completed"}}', at=end)[0]["value"][1] == str(
        ROUNDS + 1)
    assert prometheus.query(f'fl_messages_rejected_total{{job="{JOB}", kind="update", reason="unknown_signer"}}', at=end)[0][
        "value"][1] == str(GARBAGE)


def check_alert_rules(prometheus: PrometheusServer) -> None:
    expected = {r.get("alert") or r["record"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}

    def evaluated() -> list[dict[str, Any]]:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return rules if all(r["lastEvaluation"] > "2000" for r in rules) else []

    wait_until(lambda: bool(evaluated()), 30, "every rule to be evaluated")
    rules = evaluated()
    assert {r["name"] for r in rules} == expected
    for rule in rules:
        assert (rule["health"], rule.get("lastError", "")) == ("ok", ""), rule
        prometheus.query(rule["query"])  # and on demand: raises on an error
    firing = [a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"]
    assert firing == [], "a healthy, finished run must not alert"
