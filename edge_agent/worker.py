"""Answers one round: load the starting model, evaluate it, train, and build the update."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import torch

from edge_agent.algorithms import RoundContext, build_client_algorithm
from edge_agent.data.local import LocalData
from edge_agent.models import build_model
from edge_agent.state import AgentStateDir
from edge_agent.training import evaluate, train_local
from protocol.messages import GlobalState, PrivacySpent, RoundAnnouncement, TrainMetrics, Update

if TYPE_CHECKING:
    from edge_agent.privacy.trainer import PrivateTrainer


class LocalWorker:
    def __init__(self, agent_id: str, family: str, data: LocalData, device: torch.device, batch_size: int,
                 state: AgentStateDir, privacy: PrivateTrainer | None = None) -> None:
        self.agent_id = agent_id
        self.family = family
        self.data = data
        self.device = device
        self.batch_size = batch_size
        self.state = state
        self.privacy = privacy
        """DP-SGD and its budget; None trains without DP."""

    def privacy_spent(self) -> PrivacySpent | None:
        return None if self.privacy is None else self.privacy.spent()

    def answer(self, announcement: RoundAnnouncement, global_state: GlobalState | None) -> Update:
        """The update for ``announcement``; ``global_state`` is None when the family bootstraps.

        Raises ProtocolError when the round cannot be answered (parameters or state that do
        not fit this agent).
        """
        train, held_out = self.data.train, self.data.held_out
        context = RoundContext(announcement.run_id, announcement.round, self.family, self.device)
        algorithm = build_client_algorithm(announcement.algorithm, announcement.params, self.state, context)
        model = build_model(self.family, train.in_shape, train.num_classes, seed=announcement.init_seed).to(self.device)
        algorithm.load(model, global_state)
        before = evaluate(model, held_out, self.device)
        common = dict(
            run_id=announcement.run_id, agent_id=self.agent_id, round=announcement.round, task=announcement.task,
            family=self.family, base_digest=global_state.digest if global_state is not None else None,
            num_samples=len(train),
        )
        if announcement.task == "evaluate":
            metrics = TrainMetrics(eval_loss=before.loss, eval_accuracy=before.accuracy, num_eval_samples=before.samples,
                                   extra=algorithm.metrics(model, held_out))
            return Update(**common, metrics=metrics, privacy=self.privacy_spent())

        algorithm.check_plan(announcement.training)
        algorithm.begin(model, global_state)
        batch_size = announcement.training.batch_size or self.batch_size
        if self.privacy is not None:
            result = self.privacy.train(model, train, announcement.training, batch_size, self.device, algorithm)
        else:
            # From the announced seed, not the run id: the same settings reproduce the same shuffles.
            seed = zlib.crc32(f"{self.agent_id}:{announcement.init_seed}:{announcement.round}".encode())
            result = train_local(model, train, announcement.training, batch_size, self.device, algorithm, seed)
        after = evaluate(model, held_out, self.device)
        payload = algorithm.payload(model, train, result, announcement.training)
        private = self.privacy is not None
        metrics = TrainMetrics(
            eval_loss=before.loss, eval_accuracy=before.accuracy, num_eval_samples=before.samples,
            # Loss and accuracy on the training records are not covered by DP-SGD: not sent under DP.
            train_loss=None if private else result.loss, train_accuracy=None if private else result.accuracy,
            duration_s=result.duration_s, steps=result.steps,
            extra={"local_eval_accuracy": after.accuracy, "local_eval_loss": after.loss,
                   **algorithm.metrics(model, held_out)},
        )
        return Update(**common, metrics=metrics, privacy=self.privacy_spent(), **payload)
