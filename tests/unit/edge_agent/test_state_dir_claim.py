"""One agent process per state directory: a second would overwrite the first's privacy ledger and variates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.state import StateDirClaim, StateDirInUse


def test_a_held_state_dir_cannot_be_claimed_again_until_released(tmp_path: Path) -> None:
    first = StateDirClaim(tmp_path / "state")
    with pytest.raises(StateDirInUse, match=r"state_dir .*state is in use by another agent process"):
        StateDirClaim(tmp_path / "state")
    StateDirClaim(tmp_path / "other").release()  # another directory is free
    first.release()
    StateDirClaim(tmp_path / "state").release()


def test_the_cli_refuses_a_state_dir_another_process_holds(tmp_path: Path) -> None:
    held = StateDirClaim(tmp_path)  # flock conflicts across processes as it does across open files
    try:
        result = subprocess.run([sys.executable, "-m", "edge_agent", "run", "--state-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=120, check=False)
    finally:
        held.release()
    assert result.returncode == 2, result.stderr
    assert "error: cannot start: state_dir" in result.stderr and "in use by another agent process" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "agent_id").exists()  # refused before anything was written
