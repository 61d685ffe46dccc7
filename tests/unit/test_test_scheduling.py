"""scripts/test.sh's two pytest-xdist workers keep every integration test on one worker (tests/conftest.py).

A small suite in a temporary directory, with this repository's tests/conftest.py, runs under ``pytest -n 2``;
each test writes down the worker that ran it. xdist's own load scheduling would spread the six integration tests
over both workers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

RECORD = """
import os
from pathlib import Path


def record(name: str) -> None:
    Path(os.environ["RECORD_DIR"], name).write_text(os.environ.get("PYTEST_XDIST_WORKER", "none"))
"""


def test_integration_tests_run_on_one_worker_and_unit_tests_on_the_other(tmp_path: Path) -> None:
    suite, records = tmp_path / "suite", tmp_path / "records"
    records.mkdir()
    (suite / "tests" / "integration").mkdir(parents=True)
    (suite / "tests" / "unit").mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    shutil.copy(TESTS / "conftest.py", suite / "tests" / "conftest.py")
    (suite / "record.py").write_text(RECORD)
    for kind in ("integration", "unit"):
        (suite / "tests" / kind / f"test_{kind}.py").write_text(
            "import pytest\nfrom record import record\n\n\n@pytest.mark.parametrize('i', range(6))\n"
            f"def test_{kind}(i):\n    record(f'{kind}-{{i}}')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "tests"],
                          cwd=suite, env={"RECORD_DIR": str(records), "PYTHONPATH": str(suite), "PATH": ""},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 passed" in done.stdout, done.stdout
    workers = {path.name: path.read_text() for path in records.iterdir()}
    integration = {workers[f"integration-{i}"] for i in range(6)}
    unit = {workers[f"unit-{i}"] for i in range(6)}
    assert len(integration) == 1 and integration <= {"gw0", "gw1"}, workers
    assert unit - integration, f"no unit test ran beside the integration tests: {workers}"
