"""Damaged state files found at start-up: the agent refuses to start (fail safe) with a ValueError naming the file,
which ``edge-agent run`` turns into "error: cannot start: ...", rather than a bare TypeError, KeyError or
OverflowError traceback. Found in review."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_agent.agent import EdgeAgent
from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.ledger import Charge, PrivacyLedger
from edge_agent.profiles import get_profile
from edge_agent.state import AgentStateDir
from protocol.transport.mqtt import BrokerAddress
from tests.unit.edge_agent.rounds import AGENT
from tests.unit.edge_agent.state_files import plain_worker

CALIBRATION = {"noise_multiplier": 1.0, "target_epsilon": 3.0, "planned_rounds": 4, "sample_rate": 0.25,
               "steps_per_round": 8}


def _edit_ledger(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))  # json.dumps writes NaN / Infinity, and json.loads reads them back


@pytest.mark.parametrize("damage", [
    pytest.param(lambda p: p.write_bytes(b"\xff\xfe\x00\x9c garbage"), id="not-utf8"),  # UnicodeDecodeError, no path
    pytest.param(lambda p: _edit_ledger(p, calibration={**CALIBRATION, "noise_multiplier": None}), id="cal-sigma-null"),
    pytest.param(lambda p: _edit_ledger(p, calibration={**CALIBRATION, "noise_multiplier": "x"}), id="cal-sigma-str"),
    pytest.param(lambda p: _edit_ledger(p, calibration={**CALIBRATION, "noise_multiplier": float("nan")}),
                 id="cal-sigma-nan"),
    pytest.param(lambda p: _edit_ledger(p, rounds=float("inf")), id="rounds-infinity"),
])
def test_a_damaged_privacy_ledger_is_refused_naming_the_file(tmp_path: Path, damage) -> None:
    config = DPConfig(noise_multiplier=1.1, budget_epsilon=50.0)
    PrivacyLedger.open(AgentStateDir(tmp_path), config).charge([Charge(1.1, 0.25, 8)])
    damage(tmp_path / "privacy.json")
    with pytest.raises(Exception) as raised:
        PrivacyLedger.open(AgentStateDir(tmp_path), config)
    assert isinstance(raised.value, ValueError) and "privacy.json" in str(raised.value), repr(raised.value)


def test_an_unparsable_ledger_is_not_answered_with_reset_advice(tmp_path: Path) -> None:
    """An empty privacy.json (a power cut on a file system that lost the data) is refused, naming the file, but the
    generic read_json message (state.py:82) tells the operator to "move it away to reset it": for the ledger that
    is resetting the privacy budget, with none of the warning load_state_dict's own errors carry (ledger.py:244)."""
    (tmp_path / "privacy.json").write_bytes(b"")
    with pytest.raises(ValueError) as raised:
        PrivacyLedger.open(AgentStateDir(tmp_path), DPConfig(noise_multiplier=1.1))
    message = str(raised.value)
    assert "privacy.json" in message
    assert "reset it" not in message or "budget" in message, message


@pytest.mark.parametrize(("name", "content"), [
    ("progress.json", {"run_id": "run-1"}),  # KeyError 'round'
    ("progress.json", {"run_id": "run-1", "round": "x"}),  # ValueError without the file
    ("freshness.json", {"process_epoch": None}),  # TypeError
    ("secagg-pending.json", {"run_id": "run-1"}),  # KeyError 'round'
], ids=["progress-no-round", "progress-round-str", "freshness-null-epoch", "secagg-pending-no-round"])
def test_a_damaged_small_state_file_is_refused_naming_it_or_ignored(tmp_path: Path, name: str, content: dict) -> None:
    worker = plain_worker(tmp_path)
    (tmp_path / name).write_text(json.dumps(content))
    try:
        EdgeAgent(AGENT, "t", BrokerAddress("localhost", 1883), get_profile("cpu"), worker, AgentStateDir(tmp_path))
    except Exception as exc:  # noqa: BLE001
        assert isinstance(exc, ValueError) and name in str(exc), repr(exc)
