"""fl-demo --sites 2: a root Mosquitto, a bridged Mosquitto and a site aggregator per site, agents dealt to the sites;
every round completes through the sites, and the summary shows each site's agents and bytes up its bridge; with
--secure too, every training round after the bootstrap aggregated securely inside the sites."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from launcher.demo import DemoConfig, run_demo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 2


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_demo_with_two_sites_runs_every_round_through_them(tmp_path: Path, secure: bool) -> None:
    """``secure``: --secure, each site serving its two agents' SecAgg+ session and sending up their sum."""
    output = io.StringIO()
    config = DemoConfig(agents=4, rounds=ROUNDS, devices=["phone"], out=tmp_path / "run", local_epochs=1,
                        timeout_s=300, sites=2, secure=secure)
    result = run_demo(config, Console(file=output, width=200))
    printed = output.getvalue()
    assert result.ok, f"{result.reason}\n{printed[-4000:]}"
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["run"]["broker"] == "mosquitto"
    assert report["run"]["sites"] == {"site1": ["phone-0", "phone-2"], "site2": ["phone-1", "phone-3"]}, report["run"]
    rounds = report["rounds"]
    assert [(r["round"], r["outcome"]) for r in rounds] == [(n, "completed") for n in range(1, ROUNDS + 2)]
    for r in rounds:  # every agent answered through its site; what crossed each bridge is counted
        assert r["answered"] == 4 and {s: c["accepted"] for s, c in r["sites"].items()} == {"site1": 2, "site2": 2}, r
        assert all(c["bytes_up"] > 0 for c in r["sites"].values()), r
    assert "sites (the root's view" in printed and "up the bridge" in printed
    if secure:  # rounds.jsonl: the root had no session of its own; the sites served theirs
        logged = [json.loads(line) for line in (tmp_path / "run" / "coordinator" / "rounds.jsonl").read_text().splitlines()]
        assert [bool(r.get("secure")) for r in logged if r["task"] == "train"] == [False] + [True] * (ROUNDS - 1)
        assert all(s["summed"] for r in logged if r.get("secure") for s in r["secure"]["sites"].values()), logged
    assert {name: p["exit_code"] for name, p in report["run"]["processes"].items()} == {
        name: 0 for name in ("coordinator", "phone-0", "phone-1", "phone-2", "phone-3", "site-site1", "site-site2")}
