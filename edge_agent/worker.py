"""Answers one round: load the starting model, evaluate it, train, and build the update."""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch
from pydantic import ValidationError

from edge_agent.algorithms import RoundContext, build_client_algorithm, unknown_algorithm
from edge_agent.algorithms.registry import CLIENT_ALGORITHMS
from edge_agent.attacks import Attack, AttackContext, forge_payload
from edge_agent.compression import DeltaCompressor
from edge_agent.data.local import LocalData
from edge_agent.state import AgentStateDir
from edge_agent.tasks.base import Task
from edge_agent.tasks.checks import model_fingerprint
from edge_agent.training import TrainResult, evaluate, train_local
from edge_agent.weights import get_arrays
from protocol.arrays import all_finite
from protocol.compression import COMPRESSORS
from protocol.errors import ProtocolError, Reason
from protocol.messages import GlobalState, PrivacySpent, RoundAnnouncement, TrainMetrics, Update
from protocol.wire import protocol_error

if TYPE_CHECKING:
    from edge_agent.privacy.trainer import PrivateTrainer

log = logging.getLogger(__name__)


def check_finite(what: str, losses: list[float], payload: Mapping[str, object] | None = None) -> None:
    """Raise NON_FINITE if training diverged: a global state that does this is unusable, and an
    update carrying NaN would be rejected anyway. The agent skips the round (and keeps none of
    its state, see ``ClientAlgorithm.commit``); it does not die."""
    if not all(math.isfinite(x) for x in losses):
        raise ProtocolError(Reason.NON_FINITE, f"{what}: non-finite loss; skipping the round")
    for part in (payload or {}).values():
        for array in part.values() if isinstance(part, Mapping) else [part]:
            if isinstance(array, np.ndarray) and array.dtype.kind == "f" and not all_finite(array):
                raise ProtocolError(Reason.NON_FINITE, f"{what}: diverged to non-finite weights; skipping the round")


class LocalWorker:
    def __init__(self, agent_id: str, task: Task, family: str, data: LocalData, device: torch.device, batch_size: int,
                 state: AgentStateDir, privacy: PrivateTrainer | None = None, attack: Attack | None = None, *,
                 compressors: frozenset[str] | None = None) -> None:
        self.agent_id = agent_id
        self.task = task
        self.family = family
        self.layout = model_fingerprint(task.build_model(family, seed=0))
        """Fingerprint of this family's model layout: what the agent announces and compares with rounds'."""
        self.data = data
        self.device = device
        self.batch_size = batch_size
        self.state = state
        self.privacy = privacy
        """DP-SGD and its budget; None trains without DP."""
        self.attack = attack
        """Tests and benchmarks only: the Byzantine behaviour this agent adopts, if any."""
        self.compressors = frozenset(COMPRESSORS.names()) if compressors is None else compressors
        """The compressor kinds this device uses (default: every registered one); a round asking for
        another is answered uncompressed."""
        self._declined: str | None = None

    @cached_property
    def label_counts(self) -> np.ndarray | None:
        """Training samples per class (the task's label space), computed once: the data never changes.

        None for a regression task, and None under DP: a histogram of the raw training records is not
        covered by DP-SGD (its guarantee is about the noised gradients), and noising it through the
        ledger would spend budget on a statistic the training does not need, so a DP agent leaves it
        out and the coordinator weights it as if it sat at the federation's label distribution.
        """
        train = self.data.train
        if self.privacy is not None or not train.num_classes:
            return None
        return train.class_counts()

    def refusal(self, announcement: RoundAnnouncement) -> str | None:
        """Why this agent cannot take part in ``announcement``'s rounds (task, version, an algorithm it
        does not implement, or layout), or None. A run keeps its algorithm, so an unknown one is
        refused like another task: the status says why and the coordinator stops selecting it."""
        ann, mine = announcement, self.task.card.ref
        if ann.task_ref != mine:
            return f"round {ann.round} trains task {ann.task_ref}, this agent runs {mine}"
        unknown = unknown_algorithm(ann.algorithm)
        if unknown is not None:
            return unknown  # no round number: the same text every round, so it is logged and published once
        announced = ann.layouts.get(self.family)
        if announced is not None and announced != self.layout:
            return (f"round {ann.round} announces layout {announced} for family {self.family}, this agent's model has "
                    f"{self.layout}: the task's code differs between devices under one version")
        if announced is None and self.agent_id in ann.selected:
            return f"round {ann.round} announces no layout for family {self.family}"
        return None

    def privacy_spent(self) -> PrivacySpent | None:
        return None if self.privacy is None else self.privacy.spent()

    def answer(self, announcement: RoundAnnouncement, global_state: GlobalState | None) -> Update:
        """The update for ``announcement``; ``global_state`` is None when the family bootstraps.

        Raises ProtocolError when the round cannot be answered (parameters or state that do
        not fit this agent, or training that diverged).
        """
        train, held_out = self.data.train, self.data.held_out
        context = RoundContext(announcement.run_id, announcement.round, self.family, self.device)
        algorithm = build_client_algorithm(announcement.algorithm, announcement.params, self.state, context)
        model = self.task.build_model(self.family, seed=announcement.init_seed).to(self.device)
        algorithm.load(model, global_state)
        objective = self.task.objective
        before = evaluate(model, held_out, self.device, objective)
        common = dict(
            run_id=announcement.run_id, agent_id=self.agent_id, round=announcement.round, task=announcement.task,
            task_ref=self.task.card.ref, family=self.family, base_digest=global_state.digest if global_state is not None else None,
            num_samples=(self.attack.claim_samples if self.attack is not None else None) or len(train),
        )
        check_finite("the global model", [before.loss])
        if announcement.task == "evaluate":
            if self.attack is not None:
                before = self.attack.misreport(before)
            metrics = TrainMetrics(eval_loss=before.loss, eval_accuracy=before.accuracy, num_eval_samples=before.samples,
                                   extra={**_named("eval_", before.metrics), **algorithm.metrics(model, held_out)})
            return Update(**common, metrics=metrics, privacy=self.privacy_spent())

        algorithm.check_plan(announcement.training)
        algorithm.begin(model, global_state)
        init = get_arrays(model) if self.attack is not None and global_state is None else None
        if self.attack is not None:
            train = self.attack.poison(train)
        batch_size = announcement.training.batch_size or self.batch_size
        if global_state is None and proposes_initial_weights(announcement.algorithm):
            # A bootstrap proposal is the seeded initial model, untrained: honest agents of the family send
            # it byte for byte, and the coordinator takes what a strict majority sent alike
            # (coordinator/strategies/bootstrap.py). Nothing is learned from the data, nor spent of a DP budget.
            result = TrainResult(loss=before.loss, accuracy=before.accuracy or 0.0, steps=0, duration_s=0.0)
        elif self.privacy is not None:
            result = self.privacy.train(model, train, announcement.training, batch_size, self.device, algorithm,
                                        objective)
        else:
            # From the announced seed, not the run id: the same settings reproduce the same shuffles.
            seed = zlib.crc32(f"{self.agent_id}:{announcement.init_seed}:{announcement.round}".encode())
            result = train_local(model, train, announcement.training, batch_size, self.device, algorithm, seed,
                                 objective)
        after = evaluate(model, held_out, self.device, objective)
        payload = algorithm.payload(model, train, result, announcement.training)
        check_finite("local training", [result.loss, after.loss], payload)
        extra = {"local_eval_loss": after.loss, **_named("local_eval_", after.metrics),
                 **_named("eval_", before.metrics), **algorithm.metrics(model, held_out)}
        if self.attack is not None:
            attack_context = AttackContext(self.agent_id, announcement.run_id, announcement.round, self.family)
            payload = forge_payload(self.attack, payload, init, attack_context)
            extra.update(self.attack.report())
        # Last: compression post-processes the (privatised, or forged) update the agent would send.
        compressor = DeltaCompressor(self.state, self.agent_id, announcement.run_id, self.family, announcement.round)
        payload = compressor.compress(payload, announcement.compression, self.compressors)
        if compressor.residual_norm is not None:
            extra["ef_residual_norm"] = compressor.residual_norm
        if compressor.declined is not None:
            payload["compression_declined"] = compressor.declined
            if compressor.declined != self._declined:  # once per reason, not every round
                log.warning("round %d asked for compression %s; sending uncompressed: %s", announcement.round,
                            announcement.compression, compressor.declined)
        self._declined = compressor.declined
        private = self.privacy is not None
        try:
            metrics = TrainMetrics(
                eval_loss=before.loss, eval_accuracy=before.accuracy, num_eval_samples=before.samples,
                # Loss and accuracy on the training records are not covered by DP-SGD: not sent under DP.
                train_loss=None if private else result.loss,
                train_accuracy=None if private or not train.num_classes else result.accuracy,
                duration_s=result.duration_s, steps=result.steps, extra=extra,
            )
            update = Update(**common, metrics=metrics, privacy=self.privacy_spent(), **payload)
        except ValidationError as exc:  # e.g. a NaN metric: the same verdict the coordinator would give
            raise protocol_error(exc) from None
        algorithm.commit()
        compressor.commit()
        return update


def proposes_initial_weights(algorithm: str) -> bool:
    """Whether ``algorithm``'s bootstrap payload is the model's weights (FedProto's is data: its prototypes)."""
    return CLIENT_ALGORITHMS.entry(algorithm).supports("payloads", "weights")


def _named(prefix: str, metrics: Mapping[str, float]) -> dict[str, float]:
    """A task's metrics for ``TrainMetrics.extra``; ``eval_accuracy`` has its own field."""
    return {f"{prefix}{name}"[:64]: value for name, value in metrics.items()
            if f"{prefix}{name}" != "eval_accuracy" and math.isfinite(value)}
