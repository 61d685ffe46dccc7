"""scripts/test.sh's two pytest-xdist workers (tests/conftest.py): the integration tests whose deadlines are sized
to the work on one worker, one after another; the unhurried ones and the unit tests on the other.

A small suite in a temporary directory, with this repository's tests/conftest.py, runs under ``pytest -n 2``;
each test writes down the worker that ran it. xdist's own load scheduling would spread the integration tests
over both workers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import work_unit

TESTS = Path(__file__).resolve().parents[1]

RECORD = """
import os
import time
from pathlib import Path


def record(name: str) -> None:
    Path(os.environ["RECORD_DIR"], name).write_text(os.environ.get("PYTEST_XDIST_WORKER", "none"))


def wait_for_a_unit_test(timeout_s: float = 60.0) -> None:
    # The integration lane holds its worker until a unit test has run: on the other worker, if the scheduler
    # is right; if it queued them all behind this lane, this waits in vain and the test fails.
    deadline = time.monotonic() + timeout_s
    while not any(Path(os.environ["RECORD_DIR"]).glob("unit-*")):
        assert time.monotonic() < deadline, "no unit test ran while the integration tests held their worker"
        time.sleep(0.05)
"""


def test_integration_tests_run_on_one_worker_and_the_rest_on_the_other(tmp_path: Path) -> None:
    suite, records = tmp_path / "suite", tmp_path / "records"
    records.mkdir()
    (suite / "tests" / "integration").mkdir(parents=True)
    (suite / "tests" / "unit").mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    shutil.copy(TESTS / "conftest.py", suite / "tests" / "conftest.py")
    (suite / "record.py").write_text(RECORD)
    for kind, module in (("integration", "integration/test_chaos"), ("unhurried", "integration/test_images"),
                         ("unit", "unit/test_unit")):
        wait = "    wait_for_a_unit_test()\n" if kind == "integration" else ""
        (suite / "tests" / f"{module}.py").write_text(
            "import pytest\nfrom record import record, wait_for_a_unit_test\n\n\n"
            f"@pytest.mark.parametrize('i', range(6))\ndef test_{kind}(i):\n{wait}    record(f'{kind}-{{i}}')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "tests"],
                          cwd=suite, env={"RECORD_DIR": str(records), "PYTHONPATH": str(suite), "PATH": ""},
                          capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "18 passed" in done.stdout, done.stdout
    workers = {path.name: path.read_text() for path in records.iterdir()}
    integration, unhurried, unit = ({workers[f"{kind}-{i}"] for i in range(6)}
                                    for kind in ("integration", "unhurried", "unit"))
    assert len(integration) == 1 and integration <= {"gw0", "gw1"}, workers
    assert len(unhurried) == 1 and unhurried != integration, workers
    assert unit - integration, f"no unit test ran beside the integration tests: {workers}"


def test_work_units() -> None:
    assert work_unit("tests/integration/test_stragglers.py::test_a") == work_unit("tests/integration/test_demo.py::b")
    assert work_unit("tests/integration/test_images.py::t") == work_unit("tests/integration/test_bench_memory.py::t")
    assert work_unit("tests/integration/test_images.py::t") != work_unit("tests/integration/test_demo.py::t")
    assert work_unit("tests/integration/test_bench_accuracy_goals.py::t") == work_unit("tests/integration/test_x.py::t")
    assert work_unit("tests/unit/test_lint.py::t") == "tests/unit/test_lint.py::t"
