"""Fixtures that start real parts: a Mosquitto broker on a free port, and a wire recorder.

Under pytest-xdist (``scripts/test.sh`` runs two workers, ``--dist loadgroup``) every test here is in one
group, so the integration tests run one after another on one worker, as they were written to (each starts its
own fleet of processes and sizes its deadlines for a machine that runs nothing else of this suite's), while the
unit tests run on the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from tests.integration.wire import WireRecorder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.xdist_group("integration"))


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[MosquittoBroker]:
    """A real broker. Raises (the test fails, never skips) when mosquitto is not installed."""
    with MosquittoBroker(workdir=tmp_path / "broker", persistence=True) as broker:
        yield broker


@pytest.fixture
def recorder(mosquitto: MosquittoBroker) -> Iterator[WireRecorder]:
    """Everything published under fl/ from now on, seen by an independent subscriber."""
    with WireRecorder(mosquitto.url, "fl/#") as wire:
        yield wire
