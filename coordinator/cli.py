"""``coordinator run``: start the coordinator service."""

from __future__ import annotations

import logging
import signal
import threading

import typer

from coordinator.config import CoordinatorSettings
from coordinator.service import CoordinatorService
from protocol.cli_options import settings_command

app = typer.Typer(add_completion=False, help="Federated learning coordinator for edge fleets over MQTT.")


@app.callback()
def _root() -> None:
    """Federated learning coordinator for edge fleets over MQTT."""


def run(settings: CoordinatorSettings) -> int:
    """Run the coordinator until stopped (SIGTERM/SIGINT) or, with --exit-when-finished, the run ends."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return CoordinatorService(settings).run(stop)


app.command("run")(settings_command(CoordinatorSettings, run))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
