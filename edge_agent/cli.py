"""``edge-agent run --device jetson|rpi|phone|cpu``: train on this device's data."""

from __future__ import annotations

import logging
import signal
import threading

import typer

from edge_agent.config import AgentSettings
from protocol.cli_options import settings_command

app = typer.Typer(add_completion=False, help="Federated learning edge agent.")


@app.callback()
def _root() -> None:
    """Federated learning edge agent."""


def run(settings: AgentSettings) -> int:
    """Join the federation and train on local data until stopped."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Imported here so that --help and configuration errors answer without loading torch.
    from edge_agent.bootstrap import build_agent

    try:
        agent = build_agent(settings)
    except ValueError as exc:  # bad data, a model DP cannot train, a ledger that does not restore, alie alone
        typer.echo(f"error: cannot start: {exc}", err=True)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return agent.run(stop)


app.command("run")(settings_command(AgentSettings, run))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
