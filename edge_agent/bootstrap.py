"""Build a ready-to-run agent from its settings: the one path used by the CLI and the launcher."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from edge_agent.agent import EdgeAgent
from edge_agent.attacks import Collusion, build_attack
from edge_agent.config import AgentSettings
from edge_agent.data.local import build_local_data
from edge_agent.identity import check_certificate_identity
from edge_agent.profiles import claim_tf32, get_profile
from edge_agent.state import AgentStateDir
from edge_agent.tasks.base import Task
from edge_agent.tasks.checks import check_model
from edge_agent.tasks.registry import resolve_task
from edge_agent.worker import LocalWorker
from protocol.transport.mqtt import Backoff
from service_kit.keys import load_or_create_signing_key

if TYPE_CHECKING:
    from edge_agent.privacy.trainer import PrivateTrainer

log = logging.getLogger(__name__)


def build_agent(settings: AgentSettings, *, set_threads: bool = True, collusion: Collusion | None = None,
                task: Task | None = None) -> EdgeAgent:
    """``set_threads=False`` leaves torch's thread count alone (several agents in one process).

    ``collusion`` is the rendezvous of colluding attackers (tests and benchmarks only); ``task``
    saves resolving ``settings.task`` again when many agents share a process.
    """
    settings.check_tls_contents()
    task = task or resolve_task(settings.task)
    attack = build_attack(settings.attack, scale=settings.attack_scale, z=settings.attack_z, collusion=collusion,
                          claim_samples=settings.attack_claim_samples, report_accuracy=settings.attack_report_accuracy)
    profile = get_profile(settings.device)
    threads = settings.threads if settings.threads is not None else profile.threads
    if set_threads and threads:
        torch.set_num_threads(threads)
    state = AgentStateDir(settings.state_dir)
    family = settings.family or task.family_for(profile.name)
    if family not in task.families:  # settings cannot know the families (it imports no task code): check at start
        raise ValueError(f"family {family!r} is not a model family of task {task.card.ref}; its families: "
                         f"{', '.join(task.families)}")
    data = build_local_data(
        task, settings.data, eval_data=settings.eval_data, partition=settings.partition,
        num_partitions=settings.num_partitions, partition_index=settings.partition_index, alpha=settings.alpha,
        min_size=settings.min_size, classes_per_client=settings.classes_per_client,
        samples_per_class=settings.samples_per_class, data_seed=settings.data_seed,
        eval_fraction=settings.eval_fraction,
    )
    probe = task.build_model(family, seed=0)
    check_model(task, family, probe, data.train)
    privacy = _private_trainer(settings, probe, family, state)
    identity = settings.certificate_identity()  # the broker's name for this agent, if it goes by certificate
    agent_id = settings.agent_id or state.agent_id(settings.device, identity)  # written only once the rest is valid
    if identity is not None and settings.cert_file is not None:  # an id kept from before may not be the CN
        check_certificate_identity(agent_id, settings.cert_file)
    device = profile.torch_device()
    if device.type == "cuda":
        claim_tf32(settings.tf32)
    worker = LocalWorker(agent_id, task, family, data, device, settings.batch_size or profile.batch_size, state,
                         privacy, attack, compressors=settings.compressor_kinds())
    log.info("agent %s: task %s, device %s, family %s on %s, %d train / %d held-out samples",
             agent_id, task.card.ref, profile.name, family, device, len(data.train), len(data.held_out))
    straggler = settings.straggler_model()
    if straggler.kind != "off":
        log.info("agent %s: simulating stragglers, extra training time %s seconds", agent_id, straggler)
    if attack is not None:
        log.warning("!!! agent %s IS BYZANTINE: attack %s. The attack harness is for tests and benchmarks only; "
                    "every update it sends is forged and says so in metrics.extra !!!", agent_id, attack.describe())
    return EdgeAgent(agent_id, settings.federation, settings.broker_address(), profile, worker, state,
                     heartbeat_s=settings.heartbeat_s, max_message_bytes=settings.max_message_bytes,
                     exit_when_finished=settings.exit_when_finished, straggler=straggler,
                     backoff=Backoff(settings.reconnect_min_s, settings.reconnect_max_s),
                     signing_key=load_or_create_signing_key(settings.signing_key_path),
                     coordinator_key=settings.pinned_coordinator_key(), max_denials=settings.max_broker_denials,
                     secagg_audit=settings.secagg_audit,
                     secagg_vanish_after=None if settings.secagg_vanish_after == "none" else settings.secagg_vanish_after)


def _private_trainer(settings: AgentSettings, model: nn.Module, family: str,
                     state: AgentStateDir) -> PrivateTrainer | None:
    """DP-SGD and the budget saved in the state dir, after checking the model can be trained with it."""
    if not settings.dp:
        return None
    # Opacus loads only for agents with dp on.
    from edge_agent.privacy.compat import check_dp_compatible
    from edge_agent.privacy.config import DPConfig
    from edge_agent.privacy.trainer import PrivateTrainer

    config = DPConfig.from_settings(settings)
    check_dp_compatible(model, family)
    return PrivateTrainer.open(config, state)
