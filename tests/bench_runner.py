"""Run a script of bench/ as a user would, and hand back what it printed."""

from __future__ import annotations

import subprocess
import sys

from tests.chart import REPO


def run_bench(script: str, *args: str, timeout_s: float) -> str:
    """``python bench/<script> <args>`` from the repository root; its stdout, once it exited 0.

    Fails with the tail of its output (stdout, then stderr) otherwise.
    """
    result = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, capture_output=True,
                            text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, (f"bench/{script} {' '.join(args)} exited with {result.returncode}:\n"
                                    f"{(result.stdout + result.stderr)[-4000:]}")
    return result.stdout
