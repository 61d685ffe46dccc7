"""Fixtures that start real parts: a Mosquitto broker on a free port, and a wire recorder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from tests.integration.wire import WireRecorder


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
