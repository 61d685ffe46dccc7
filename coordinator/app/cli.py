"""``coordinator run``: start the coordinator service; ``coordinator enroll``: admit devices.

Only the settings class (for the flags) is imported at the top: the service, its MQTT loop and
the certificate code load inside the commands, so ``--help`` and ``--version`` answer quickly.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from coordinator.settings import CoordinatorSettings
from coordinator.sites.settings import SiteSettings
from protocol.security.signing import PublicKey
from service_kit.cli_options import settings_command, version_option
from service_kit.keys import load_or_create_signing_key
from service_kit.startup import CannotStart

# Plain click layout, not rich's table: with some 70 flags, rich's fixed option column left the help
# a sliver of an 80-column terminal and cut values off; plain text wraps and greps.
app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"max_content_width": 120},
                  help="Federated learning coordinator for edge fleets over MQTT.")


@app.callback()
def _root(version: bool = version_option("coordinator")) -> None:
    """Federated learning coordinator for edge fleets over MQTT."""


def _serve(log_level: str, service: Callable[[], Any]) -> int:
    """Log at ``log_level`` and run the service ``service()`` builds until SIGTERM or SIGINT (or it ends)."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        built = service()
    except CannotStart as exc:  # what the operator fixes (a file, a port, a directory): one line, not a traceback
        typer.echo(f"error: cannot start: {exc}", err=True)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return int(built.run(stop))


def run(settings: CoordinatorSettings) -> int:
    """Run the coordinator until stopped (SIGTERM/SIGINT) or, with --exit-when-finished, the run ends."""
    from coordinator.app.service import CoordinatorService

    return _serve(settings.log_level, lambda: CoordinatorService(settings))


app.command("run", short_help="Run the coordinator until stopped, or until the run ends.")(
    settings_command(CoordinatorSettings, run))


def site(settings: SiteSettings) -> int:
    """Run a site aggregator until stopped: fold the site's agents' updates into partial aggregates for the root."""
    from coordinator.sites.service import SiteService

    return _serve(settings.log_level, lambda: SiteService(settings))


app.command("site", short_help="Run a site aggregator behind a bridged site broker (synchronous rounds: FedAvg, FedProx, SCAFFOLD, FedProto).")(
    settings_command(SiteSettings, site))


@app.command("enroll", short_help="Enroll devices: issue (or take) their keys and register them.")
def enroll_command(
    agent_ids: list[str] = typer.Argument(..., help="ids of the devices to enroll"),
    state_dir: Path = typer.Option(Path("coordinator-state"), help="the coordinator's state directory"),
    # A string show_default describes an unset (None) default; typer prints it in parentheses.
    enrolled_agents_file: Path | None = typer.Option(None, show_default="STATE_DIR/enrolled.json",
                                                     help="the enrolled agents' public keys, updated in place"),
    signing_key_file: Path | None = typer.Option(None, show_default="STATE_DIR/coordinator_key.pem",
                                                 help="the coordinator's Ed25519 key (created if missing)"),
    bundle_dir: Path = typer.Option(Path("enrolled"), help="where each device's credentials are written, one folder each"),
    public_key: str | None = typer.Option(None, show_default="issue a new key per device",
                                          help="register this key (ed25519:<base64>) for one device that made "
                                               "its own, instead of issuing one"),
    max_samples: int | None = typer.Option(None, min=1, show_default="the coordinator's max_samples_per_update",
                                           help="most samples the device may claim as its weight"),
    ca_cert: Path | None = typer.Option(None, show_default="no certificates",
                                        help="also issue each device a client certificate (CN = its id) "
                                             "signed by this CA, for brokers that authenticate by certificate"),
    ca_key: Path | None = typer.Option(None, show_default="unset", help="the CA's private key (unencrypted PEM), "
                                                                        "with --ca-cert"),
    cert_days: int = typer.Option(365, min=1, help="validity of issued client certificates, in days"),
) -> None:
    """Enroll devices: issue (or take) each one's signing key, register it, and hand it the coordinator's key.

    A running coordinator picks new enrollments up without a restart, and a broker that trusts
    the CA needs no change. Each device's folder holds agent_key.pem (its private key: copy it to
    the device only), coordinator.pub, and with --ca-cert client.crt and client.key; run the agent
    with --signing-key-file agent_key.pem --coordinator-key coordinator.pub (and --cert-file
    client.crt --key-file client.key --ca-file <the broker's CA>).
    """
    if public_key is not None and len(agent_ids) != 1:
        raise typer.BadParameter("--public-key registers one device at a time", param_hint="--public-key")
    if (ca_cert is None) != (ca_key is None):
        raise typer.BadParameter("give --ca-cert and --ca-key together", param_hint="--ca-cert")
    try:
        given = None if public_key is None else PublicKey.from_text(public_key)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--public-key") from None
    settings = CoordinatorSettings(state_dir=state_dir, enrolled_agents_file=enrolled_agents_file,
                                   signing_key_file=signing_key_file)
    try:
        _enroll_each(settings, agent_ids, given, bundle_dir, max_samples, ca_cert, ca_key, cert_days)
    except CannotStart as exc:  # a key or enrollment file to fix: one line, as ``run`` says it
        typer.echo(f"error: cannot enroll: {exc}", err=True)
        raise typer.Exit(2) from None


def _enroll_each(settings: CoordinatorSettings, agent_ids: list[str], given: PublicKey | None, bundle_dir: Path,
                 max_samples: int | None, ca_cert: Path | None, ca_key: Path | None, cert_days: int) -> None:
    from coordinator.fleet.certificates import issue_client_certificate, load_issuing_ca
    from coordinator.fleet.enrollment import enroll

    # Every file is read (and every missing device key made) before the first device is enrolled.
    ca = load_issuing_ca(ca_cert, ca_key) if ca_cert is not None and ca_key is not None else None
    coordinator_key = load_or_create_signing_key(settings.signing_key_path).public_key
    keys: dict[str, PublicKey] = {}
    for agent_id in agent_ids:
        folder = bundle_dir / agent_id
        folder.mkdir(parents=True, exist_ok=True)
        keys[agent_id] = given or load_or_create_signing_key(folder / "agent_key.pem").public_key
    for agent_id, key in keys.items():
        folder = bundle_dir / agent_id
        enroll(settings.enrollment_path, agent_id, key, max_samples)
        (folder / "coordinator.pub").write_text(coordinator_key.to_text() + "\n")
        if ca is not None:
            issue_client_certificate(ca, agent_id, folder, cert_days)
        typer.echo(f"enrolled {agent_id} (key {key.key_id}); credentials in {folder}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
