"""The label-skew summary: what each agent logs at start is what the run's report keeps."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from edge_agent.data.local import build_local_data
from edge_agent.tasks.registry import resolve_task
from launcher import report
from launcher.fleet import FleetSpec, default_fleet


@pytest.mark.parametrize(("partition", "extra"), [("dirichlet", {}), ("classes", {"classes_per_client": 3}),
                                                  ("iid", {})])
def test_the_report_summarises_exactly_the_partitions_the_agents_train_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, partition: str, extra: dict) -> None:
    spec = FleetSpec(default_fleet(6), partition=partition, alpha=0.3, data_seed=3, agent_settings=extra)
    rows = report.label_skew(spec)
    assert [r["agent"] for r in rows] == [a.name for a in spec.agents]
    for agent, row in zip(spec.agents, rows, strict=True):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="edge_agent.data.local"):
            local = build_local_data(resolve_task("digits"), partition=partition, num_partitions=6,
                                     partition_index=agent.partition_index, alpha=0.3, data_seed=3,
                                     classes_per_client=extra.get("classes_per_client", 2))
        labels = np.concatenate([local.train.y, local.held_out.y])
        assert row["samples"] == len(labels)
        assert row["classes"] == len(np.unique(labels))
        logged = caplog.text
        assert "label skew of the" in logged and "KL(client||global)" in logged
        assert f"holds partition {agent.partition_index}: {row['samples']} samples, {row['classes']} classes, " \
               f"KL to global {row['kl_divergence']:.3f}" in logged
    if partition == "iid":
        assert max(r["kl_divergence"] for r in rows) < 0.1
    else:
        assert min(r["kl_divergence"] for r in rows) > 0.2

    path = report.write_json(tmp_path / "report.json", run={}, rounds=[], fleet=rows, evaluation=None)
    assert json.loads(path.read_text())["fleet"] == rows
