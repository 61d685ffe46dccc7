"""protocol/ and coordinator/ import, and their rounds run, where torch cannot be imported.

The coordinator image carries no torch (DESIGN.md). A subprocess installs an import blocker
for torch and opacus, imports every module of both packages, then runs the coordinator's unit
tests that drive whole rounds through the engine (each algorithm, FedBuff, the robust rules,
secure rounds, sites), the protocol's codec and conformance tests and the numpy-only partition
tests, through pytest.main without loading any conftest.py. The other 1,350 coordinator and
protocol tests run in the main session only (running them all here again took 75-110 s of each
CI run): what a lazy import inside one of them would reach, ``test_boundaries.py`` already
refuses, reading every import statement of both packages, function-level ones included.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

ROUND_TESTS = [f"tests/unit/{name}.py" for name in (
    "coordinator/test_engine", "coordinator/test_engine_actions", "coordinator/test_engine_algorithms",
    "coordinator/test_fedbuff", "coordinator/test_fedproto_strategy", "coordinator/test_scaffold_strategy",
    "coordinator/test_robust_aggregation", "coordinator/test_secure_rounds", "coordinator/test_root_restart_with_sites",
    "protocol/test_codec", "protocol/test_conformance",
)]
"""Tests that run rounds end to end in process, and encode and decode messages: where a lazy import would run."""

RUNNER = f"ROUND_TESTS = {ROUND_TESTS!r}\n" + textwrap.dedent(
    """
    import importlib
    import importlib.abc
    import pkgutil
    import sys

    BLOCKED = {"torch", "opacus", "torchvision"}


    class BlockTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by test_no_torch)", name=name)
            return None


    sys.meta_path.insert(0, BlockTorch())
    assert not BLOCKED & set(sys.modules), "torch was imported before the blocker"
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        sys.exit("the import blocker does not work")

    imported = []
    for package_name in ("protocol", "coordinator"):
        package = importlib.import_module(package_name)
        imported.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            if info.name.rpartition(".")[2] == "__main__":
                continue  # would run the CLI
            importlib.import_module(info.name)
            imported.append(info.name)
    for name in ("edge_agent.data.partition", "edge_agent.data.datasets"):
        importlib.import_module(name)
        imported.append(name)
    print(f"imported {len(imported)} modules without torch")

    import pytest

    code = pytest.main([*ROUND_TESTS, "tests/unit/edge_agent/test_partition.py",
                        "-q", "-p", "no:cacheprovider", "--noconftest"])
    leaked = sorted(BLOCKED & set(sys.modules))
    if leaked:
        sys.exit(f"blocked modules in sys.modules: {leaked}")
    sys.exit(int(code))
    """
)


def test_protocol_and_coordinator_work_without_torch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", RUNNER], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "without torch" in output
    assert " passed" in output and " failed" not in output, output[-3000:]
