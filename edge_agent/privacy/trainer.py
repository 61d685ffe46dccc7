"""DP for one agent: its settings and its ledger, and the rounds it trains under them."""

from __future__ import annotations

import logging

import torch

from edge_agent.algorithms.base import ClientAlgorithm
from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.dp_training import RoundShape, train_private
from edge_agent.privacy.errors import PrivacyUnsupported
from edge_agent.privacy.ledger import PrivacyLedger
from edge_agent.privacy.prototypes import PrototypeRelease
from edge_agent.state import AgentStateDir
from edge_agent.tasks.base import CLASSIFICATION, Objective
from edge_agent.training import TrainResult
from protocol.messages import LocalTraining, PrivacySpent

log = logging.getLogger(__name__)


class PrivateTrainer:
    def __init__(self, config: DPConfig, ledger: PrivacyLedger) -> None:
        self.config = config
        self.ledger = ledger
        self._warned_delta = False

    @classmethod
    def open(cls, config: DPConfig, state: AgentStateDir) -> PrivateTrainer:
        ledger = PrivacyLedger.open(state, config)
        budget = "no budget (never stops)" if ledger.budget is None else f"budget {ledger.budget:.4g}"
        log.info("DP-SGD on (%s accountant, clip %.3g): epsilon %.4g spent at delta %.3g over %d rounds, %s",
                 config.accountant, config.max_grad_norm, ledger.epsilon, config.delta, ledger.rounds, budget)
        if ledger.exhausted:
            log.warning("the privacy budget is spent (epsilon %.4g of %.4g): this agent will not train",
                        ledger.epsilon, ledger.budget)
        return cls(config, ledger)

    def spent(self) -> PrivacySpent:
        return self.ledger.spent()

    def train(self, model: FedModel, data: Dataset, plan: LocalTraining, batch_size: int, device: torch.device,
              algorithm: ClientAlgorithm, objective: Objective = CLASSIFICATION) -> TrainResult:
        """Charge the round to the ledger (or raise ``BudgetExhausted``), then train it with DP-SGD."""
        if not algorithm.dp_compatible:
            raise PrivacyUnsupported(f"algorithm {algorithm.name!r} is not marked DP-compatible: this agent "
                                     "trains with dp on and will not run it")
        if algorithm.absent_class_scale != 1.0:
            raise PrivacyUnsupported(f"{algorithm.name}'s absent_class_scale shapes the loss by which classes the "
                                     "private data holds, which DP-SGD does not cover: leave it at 1 with dp on")
        shape = RoundShape.of(len(data), batch_size, plan.epochs, plan.steps)
        self._check_delta(len(data))
        sigma = self.ledger.noise_multiplier(self.config, shape.sample_rate, shape.steps)
        charges = [shape.charge(sigma)]
        if algorithm.releases_prototypes:
            if self.config.prototype_noise_multiplier is None:
                raise PrivacyUnsupported(
                    f"algorithm {algorithm.name!r} sends prototypes computed from raw records, which DP-SGD does "
                    "not cover: set dp_prototype_noise_multiplier to release them through a Gaussian mechanism")
            release = PrototypeRelease(self.config.prototype_noise_multiplier, self.config.prototype_clip)
            charges.append(release.charge())
            algorithm.prototype_release = release
        epsilon = self.ledger.charge(charges)  # on disk before the data is touched
        log.info("round charged: %d steps at sigma %.4g, rate %.4f; epsilon now %.4g", shape.steps, sigma,
                 shape.sample_rate, epsilon)
        return train_private(model, data, plan, shape, charges[0], self.config.max_grad_norm, device, algorithm,
                             objective)

    def _check_delta(self, num_samples: int) -> None:
        if not self._warned_delta and self.config.delta * num_samples >= 1.0:
            self._warned_delta = True
            log.warning("dp_delta %.3g is not below 1/n = %.3g for %d training records: a mechanism that leaks a "
                        "whole record with probability delta would meet this guarantee", self.config.delta,
                        1.0 / num_samples, num_samples)
