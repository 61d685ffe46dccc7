"""Answers one round: load the global state, evaluate it, train, and build the update."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

import numpy as np
import torch

from edge_agent.algorithms import build_client_algorithm
from edge_agent.attacks import Attack, AttackContext, forge_payload
from edge_agent.data.local import LocalData
from edge_agent.models import build_model
from edge_agent.state import AgentStateDir
from edge_agent.training import evaluate, train_local
from edge_agent.weights import get_arrays, set_arrays
from protocol.errors import ProtocolError, Reason
from protocol.messages import GlobalState, RoundAnnouncement, TrainMetrics, Update


def check_finite(what: str, losses: list[float], payload: Mapping[str, object] | None = None) -> None:
    """Raise NON_FINITE if training diverged: a global state that does this is unusable, and an
    update carrying NaN would be rejected anyway. The agent skips the round; it does not die."""
    if not all(math.isfinite(x) for x in losses):
        raise ProtocolError(Reason.NON_FINITE, f"{what}: non-finite loss; skipping the round")
    for part in (payload or {}).values():
        for array in part.values() if isinstance(part, Mapping) else [part]:
            if isinstance(array, np.ndarray) and array.dtype.kind == "f" and not np.isfinite(array).all():
                raise ProtocolError(Reason.NON_FINITE, f"{what}: diverged to non-finite weights; skipping the round")


class LocalWorker:
    def __init__(self, agent_id: str, family: str, data: LocalData, device: torch.device, batch_size: int,
                 state: AgentStateDir, attack: Attack | None = None) -> None:
        self.agent_id = agent_id
        self.family = family
        self.data = data
        self.device = device
        self.batch_size = batch_size
        self.state = state
        self.attack = attack
        """Tests and benchmarks only: the Byzantine behaviour this agent adopts, if any."""

    def answer(self, announcement: RoundAnnouncement, global_state: GlobalState | None) -> Update:
        """The update for ``announcement``; ``global_state`` is None when the family bootstraps."""
        train, held_out = self.data.train, self.data.held_out
        model = build_model(self.family, train.in_shape, train.num_classes, seed=announcement.init_seed).to(self.device)
        if global_state is not None:
            set_arrays(model, global_state.weights)
        before = evaluate(model, held_out, self.device)
        common = dict(
            run_id=announcement.run_id, agent_id=self.agent_id, round=announcement.round, task=announcement.task,
            family=self.family, base_digest=global_state.digest if global_state is not None else None,
            num_samples=len(train),
        )
        check_finite("the global model", [before.loss])
        if announcement.task == "evaluate":
            metrics = TrainMetrics(eval_loss=before.loss, eval_accuracy=before.accuracy, num_eval_samples=before.samples)
            return Update(**common, metrics=metrics)

        algorithm = build_client_algorithm(announcement.algorithm, announcement.params, self.state)
        algorithm.begin(model, global_state, self.device)
        init = get_arrays(model) if self.attack is not None and global_state is None else None
        if self.attack is not None:
            train = self.attack.poison(train)
        batch_size = announcement.training.batch_size or self.batch_size
        seed = zlib.crc32(f"{self.agent_id}:{announcement.run_id}:{announcement.round}".encode())
        result = train_local(model, train, announcement.training, batch_size, self.device, algorithm, seed)
        after = evaluate(model, held_out, self.device)
        payload = algorithm.payload(model, result.steps, announcement.training.learning_rate)
        check_finite("local training", [result.loss, after.loss], payload)
        extra = {"local_eval_accuracy": after.accuracy, "local_eval_loss": after.loss}
        if self.attack is not None:
            context = AttackContext(self.agent_id, announcement.run_id, announcement.round, self.family)
            payload = forge_payload(self.attack, payload, init, context)
            extra.update(self.attack.report())
        metrics = TrainMetrics(
            eval_loss=before.loss, eval_accuracy=before.accuracy, num_eval_samples=before.samples,
            train_loss=result.loss, train_accuracy=result.accuracy, duration_s=result.duration_s, steps=result.steps,
            extra=extra,
        )
        return Update(**common, metrics=metrics, **payload)
