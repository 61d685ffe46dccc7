"""``edge-agent run --device jetson|rpi|phone|cpu``: train on this device's data;
``edge-agent tasks``: the tasks installed here, or one task's card for the coordinator.

Only the settings class (for the flags) is imported at the top: torch, Opacus and the task
code load inside the commands, so ``--help`` and ``--version`` answer without them.
"""

from __future__ import annotations

import logging
import signal
import threading

import typer

from edge_agent.config import AgentSettings
from edge_agent.resident import give_back_library_pages
from service_kit.cli_options import settings_command, version_option
from service_kit.startup import CannotStart

# Plain click layout, not rich's table: with some 50 flags, rich's fixed option column left the help
# a sliver of an 80-column terminal and cut values off; plain text wraps and greps.
app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"max_content_width": 120},
                  help="Federated learning edge agent.")


@app.callback()
def _root(version: bool = version_option("edge-agent")) -> None:
    """Federated learning edge agent."""


def run(settings: AgentSettings) -> int:
    """Join the federation and train on local data until stopped."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Each phase of start-up leaves library code resident that the agent will not run again; giving it
    # back after each one (settings, then torch and the agent's code, then the build) keeps the peak
    # near one phase's pages, not their sum (edge_agent/resident.py).
    give_back = settings.give_back_library_pages
    if give_back:
        give_back_library_pages("after the settings")
    # Imported here so that --help and configuration errors answer without loading torch.
    from edge_agent.bootstrap import build_agent
    from edge_agent.state import StateDirClaim

    if give_back:
        give_back_library_pages("after importing torch")
    try:
        claim = StateDirClaim(settings.state_dir)  # held until the process exits
        agent = build_agent(settings)
    except (ValueError, CannotStart) as exc:  # bad data, a model DP cannot train, a ledger that does not restore,
        # a state directory another agent holds, a signing key file that is not a key, alike
        typer.echo(f"error: cannot start: {exc}", err=True)
        return 2
    if give_back:
        give_back_library_pages("after building the agent")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return agent.run(stop)
    finally:
        claim.release()


app.command("run")(settings_command(AgentSettings, run))


@app.command("tasks", short_help="List the installed tasks, or print one task's card.")
def tasks(
    card: str | None = typer.Option(None, "--card", metavar="<task>", show_default="list the installed tasks",
                                    help="print this task's card (JSON), every model family's layout included, "
                                         "for 'coordinator run --task FILE'"),
) -> None:
    """List the installed tasks (entry-point group edgefl.tasks), or print one task's card."""
    from edge_agent.tasks.checks import full_card
    from edge_agent.tasks.registry import TaskNotFound, installed_tasks, resolve_task

    if card is not None:
        try:
            typer.echo(full_card(resolve_task(card)).to_json(), nl=False)
        except TaskNotFound as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        return
    rows = []
    for installed in installed_tasks():
        try:
            task = resolve_task(installed.name)
        except TaskNotFound as exc:  # one broken package must not hide the others
            rows.append((installed.name, "-", "-", "-", f"cannot load: {exc}"))
            continue
        c = task.card
        rows.append((c.name, c.version, str(c.num_classes) if c.num_classes else c.kind, ", ".join(c.families),
                     f"{installed.distribution}: {c.description}"))
    header = ("TASK", "VERSION", "CLASSES", "FAMILIES", "FROM")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4])


def main() -> None:
    app()


if __name__ == "__main__":
    main()
