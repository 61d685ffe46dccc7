"""The coordinator's metrics: Prometheus naming, bounded labels, and the run-progress gauges."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.telemetry.metrics import ROUND_OUTCOMES, RUNTIME_PREFIXES, CoordinatorMetrics
from protocol.version import SOFTWARE_VERSION
from tests.unit.coordinator.test_engine import Clock, hello, make_engine, send, update

UNBOUNDED_LABELS = {"agent", "agent_id", "client_id", "run_id", "topic", "session"}


def test_names_follow_prometheus_conventions() -> None:
    metrics = CoordinatorMetrics(CollectorRegistry())
    families = [f for f in metrics.registry.collect() if not f.name.startswith(RUNTIME_PREFIXES)]
    assert len(families) > 20
    for family in families:
        assert family.name.startswith("fl_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_versions")), family.name  # a unit, always
        names = {s.name for s in family.samples} or {family.name}
        for name in names:
            assert "_milliseconds" not in name and "_kilobytes" not in name, name
        for sample in family.samples:
            assert not UNBOUNDED_LABELS & set(sample.labels), (family.name, sample.labels)


def test_a_scrape_carries_process_and_python_metrics() -> None:
    """The client library's runtime collectors ride on the coordinator's own registry: what a
    Prometheus scrape of /metrics (generate_latest) returns has them, for every fresh registry."""
    for _ in range(2):  # a second registry in the same process: its own collectors, no clash
        scraped = generate_latest(CoordinatorMetrics(CollectorRegistry()).registry).decode()
        samples = {s.name: s for f in text_string_to_metric_families(scraped) for s in f.samples}
        assert samples["python_info"].labels["implementation"] == platform.python_implementation()
        assert "python_gc_collections_total" in samples
        assert "fl_rounds_total" in samples
        if sys.platform.startswith("linux"):  # ProcessCollector reads /proc
            assert samples["process_resident_memory_bytes"].value > 1_000_000
            assert samples["process_cpu_seconds_total"].value > 0
            assert samples["process_open_fds"].value >= 3


def test_known_outcomes_are_exported_before_the_first_round() -> None:
    metrics = CoordinatorMetrics(CollectorRegistry())
    for outcome in ROUND_OUTCOMES:
        assert metrics.registry.get_sample_value("fl_rounds_total", {"outcome": outcome}) == 0
    assert metrics.registry.get_sample_value("fl_updates_total", {"outcome": "rejected"}) == 0
    for kind, reason in (("update", "malformed"), ("update", "late"), ("agent_status", "schema"),
                         ("unknown", "bad_topic")):
        assert metrics.registry.get_sample_value("fl_messages_rejected_total", {"kind": kind, "reason": reason}) == 0


def test_progress_gauges_follow_the_run(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, metrics = make_engine(tmp_path, clock, rounds=1, evaluate_final=False, round_deadline_s=10.0)
    value = metrics.registry.get_sample_value
    assert value("fl_rounds_planned") == 1
    assert value("fl_coordinator_info", {"version": SOFTWARE_VERSION, "federation": "t", "algorithm": "fedavg",
                                         "aggregator": "mean()"}) == 1
    assert value("fl_round_deadline_seconds") == 10.0
    assert value("fl_run_finished") == 0
    assert value("fl_last_progress_timestamp_seconds") == clock.now

    hello(engine, "a"), hello(engine, "b")
    clock.now += 5
    engine.tick()
    assert value("fl_round_current") == 1
    assert value("fl_round_learning_rate") == 0.05  # the settings' learning_rate, no decay
    assert value("fl_round_quorum") == 1  # half of two agents
    assert value("fl_last_progress_timestamp_seconds") == clock.now

    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    clock.now += 3
    engine.tick()
    assert engine.finished
    assert value("fl_run_finished") == 1
    assert value("fl_last_progress_timestamp_seconds") == clock.now
    assert value("fl_round_agents", {"state": "answered"}) == 2
    assert value("fl_rounds_total", {"outcome": "completed"}) == 1


def test_a_restarted_coordinator_reports_where_it_resumed(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick()
    _, _, metrics = make_engine(tmp_path, clock)
    assert metrics.registry.get_sample_value("fl_round_current") == 1
    assert metrics.registry.get_sample_value("fl_run_finished") == 0


def test_a_restarted_coordinator_reports_the_rate_of_the_round_it_resumed_open(tmp_path: Path) -> None:
    clock = Clock()
    engine, _, _ = make_engine(tmp_path, clock, learning_rate=0.08, learning_rate_decay=0.5)
    hello(engine, "a"), hello(engine, "b")
    engine.tick()
    send(engine, update(engine, "a", 1)), send(engine, update(engine, "b", 1))
    engine.tick()
    engine.tick()
    assert engine.open is not None and engine.open.number == 2
    _, _, metrics = make_engine(tmp_path, clock, learning_rate=0.08, learning_rate_decay=0.5)
    assert metrics.registry.get_sample_value("fl_round_learning_rate") == 0.04
