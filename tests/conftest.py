"""How ``scripts/test.sh`` spreads the suite over two pytest-xdist workers.

The integration tests run one after another, all on one worker, as they were written to: each starts its own
broker and fleet of processes and sizes its deadlines for a machine that runs no other of them at once. Every
unit test is a unit of work of its own, so the other worker takes them while the first waits on the fleets.
(xdist's ``--dist loadgroup`` would say this with a marker, but with pytest 9 it no longer keeps a group on one
worker: it renames ``item._nodeid``, which pytest 9 no longer reads; a scheduler choosing by path does not depend
on that.)
"""

from __future__ import annotations

from typing import Any

import pytest

INTEGRATION = "tests/integration/"


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which may not be installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "load":  # -n alone; another --dist chosen on the command line is left alone
        return None
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return INTEGRATION if nodeid.startswith(INTEGRATION) else nodeid

    return IntegrationOnOneWorker(config, log)
