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
    import torch

    from edge_agent.agent import EdgeAgent
    from edge_agent.data.local import build_local_data
    from edge_agent.profiles import get_profile
    from edge_agent.state import AgentStateDir
    from edge_agent.worker import LocalWorker

    profile = get_profile(settings.device)
    threads = settings.threads if settings.threads is not None else profile.threads
    if threads:
        torch.set_num_threads(threads)
    state = AgentStateDir(settings.state_dir)
    agent_id = settings.agent_id or state.agent_id(settings.device)
    data = build_local_data(
        settings.data, partition=settings.partition, num_partitions=settings.num_partitions,
        partition_index=settings.partition_index, alpha=settings.alpha, min_size=settings.min_size,
        classes_per_client=settings.classes_per_client, data_seed=settings.data_seed,
        eval_fraction=settings.eval_fraction,
    )
    family = settings.family or profile.family
    device = profile.torch_device()
    worker = LocalWorker(agent_id, family, data, device, settings.batch_size or profile.batch_size, state)
    logging.getLogger(__name__).info(
        "agent %s: device %s, family %s on %s, %d train / %d held-out samples",
        agent_id, profile.name, family, device, len(data.train), len(data.held_out))
    agent = EdgeAgent(agent_id, settings.federation, settings.broker_address(), profile, worker, state,
                      heartbeat_s=settings.heartbeat_s, max_message_bytes=settings.max_message_bytes,
                      exit_when_finished=settings.exit_when_finished)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return agent.run(stop)


app.command("run")(settings_command(AgentSettings, run))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
