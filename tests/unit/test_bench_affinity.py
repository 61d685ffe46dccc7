"""bench/affinity.py: a process started inside ``spawning_on`` runs where it was told (the kernel's word, read from the
child itself), the starting thread goes back to where it was, and ``split`` refuses a split with no core for a side."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from types import ModuleType

import pytest

from tests.chart import REPO

CHILD = "import os; print(','.join(str(c) for c in sorted(os.sched_getaffinity(0))))"


@pytest.fixture(scope="module")
def affinity() -> ModuleType:
    spec = importlib.util.spec_from_file_location("affinity", REPO / "bench" / "affinity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("affinity", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def _cores_of_child() -> set[int]:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    return {int(c) for c in out.strip().split(",")}


def test_split_then_spawn_on_each_side(affinity: ModuleType) -> None:
    """In a thread of its own: the split moves only the calling thread, never the test's."""
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.fail(f"this test needs two usable cores (the bench's --pin does): {sorted(mine)}")
    seen: dict[str, object] = {}

    def run() -> None:
        try:
            chosen = affinity.split()
            seen["split"] = chosen
            seen["sender child"] = _cores_of_child()
            with affinity.spawning_on(chosen.receiver):
                seen["receiver child"] = _cores_of_child()
            seen["thread after"] = os.sched_getaffinity(0)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            seen["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(60)
    assert "error" not in seen, seen["error"]
    chosen = seen["split"]
    assert chosen.receiver == {max(mine)} and chosen.senders == mine - {max(mine)}  # type: ignore[attr-defined]
    assert seen["receiver child"] == {max(mine)}
    assert seen["sender child"] == seen["thread after"] == mine - {max(mine)}
    assert os.sched_getaffinity(0) == mine  # the test's own thread never moved


def test_a_split_without_a_core_for_each_side_is_refused(affinity: ModuleType) -> None:
    cores = len(os.sched_getaffinity(0))
    for asked in (0, cores):
        with pytest.raises(ValueError, match="a core for each side"):
            affinity.split(asked)
    assert len(os.sched_getaffinity(0)) == cores


def test_spawning_on_none_changes_nothing(affinity: ModuleType) -> None:
    before = os.sched_getaffinity(0)
    with affinity.spawning_on(None):
        assert _cores_of_child() == before
    assert os.sched_getaffinity(0) == before
