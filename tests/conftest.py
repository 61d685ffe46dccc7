"""How ``scripts/test.sh`` spreads the suite over two pytest-xdist workers.

The integration tests that size round deadlines to the work (stragglers, chaos, the robust bench's 5 s rounds,
...) run one after another on one worker, as they were written to: each starts its own broker and fleet of
processes and sizes its deadlines for a machine that runs no other of them at once. The other worker takes the
few long integration tests whose rounds wait for every agent under deadlines of 60 s to an hour, so that a busy
machine makes them slower and nothing else (``UNHURRIED``), and the unit tests, each a unit of work of its own.
Most integration tests keep one of the two cores busy (their fleets are mostly waiting, or run in one Python
process), so the other worker's work fills the second.
(xdist's ``--dist loadgroup`` would say this with markers, but with pytest 9 it no longer keeps a group on one
worker: it renames ``item._nodeid``, which pytest 9 no longer reads; a scheduler choosing by path does not depend
on that.)
"""

from __future__ import annotations

from typing import Any

import pytest

INTEGRATION = "tests/integration/"
UNHURRIED = tuple(f"{INTEGRATION}{name}.py::" for name in (
    "test_images",  # builds both images (minutes), then two rounds at the coordinator's 60 s deadline
    "test_bench_accuracy",  # launcher.scenarios: every round waits up to an hour for all agents
    "test_bench_privacy_quick",  # 600 s deadlines, all agents needed
    "test_bench_memory",  # 300 s deadlines, all agents needed; measures memory, not time
    "test_bench_scaffold_reference",  # the paper's algorithm in one process: no broker, no deadline
    "test_bench_agent_start",  # waits (up to 600 s) for agents to come online; times are reported, not asserted
))
"""Integration tests that may run beside the others: no outcome of theirs depends on how fast the machine is."""


def work_unit(nodeid: str) -> str:
    """The scope xdist hands out whole: the integration tests by lane, each other test alone."""
    if nodeid.startswith(UNHURRIED):
        return "unhurried integration tests"
    if nodeid.startswith(INTEGRATION):
        return "integration tests"
    return nodeid


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which may not be installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "load":  # -n alone; another --dist chosen on the command line is left alone
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByLane(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByLane(config, log)
