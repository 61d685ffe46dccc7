"""Two coordinators on one state directory would overwrite each other's checkpoint and rounds log: the second one's
run stops before it reads or writes anything, naming the directory; the claim ends with the run."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from coordinator.app.service import CoordinatorService
from coordinator.settings import CoordinatorSettings
from service_kit.state_claim import StateDirClaim, StateDirInUse


def test_a_second_coordinator_on_a_state_dir_in_use_stops_naming_it(tmp_path: Path) -> None:
    settings = CoordinatorSettings(federation="t", state_dir=tmp_path / "state", rounds=1, http_port=0)
    service = CoordinatorService(settings, CollectorRegistry())
    held = StateDirClaim(tmp_path / "state", "coordinator")  # what the first coordinator's run holds
    with pytest.raises(StateDirInUse, match=r"state_dir .*state is in use by another coordinator process"):
        service.run(threading.Event())
    assert not (tmp_path / "state" / "checkpoint.msgpack").exists()
    held.release()
    StateDirClaim(tmp_path / "state", "coordinator").release()  # free again once its holder lets go
