"""One round of local DP-SGD through Opacus, on tensors already in memory.

Per round, a fresh set of Opacus per-sample-gradient hooks is attached to the round's model
(Opacus cannot hook one module twice) and removed at the end; the privacy accountant lives
outside, in the agent's :class:`~edge_agent.privacy.ledger.PrivacyLedger`.

Each step: Poisson sampling (every record joins the batch independently with probability
``sample_rate``, Opacus's ``UniformWithReplacementSampler``), forward and backward, then
``DPOptimizer.pre_step`` clips every per-sample gradient to ``max_grad_norm``, sums, adds
Gaussian noise of std ``noise_multiplier * max_grad_norm`` and divides by the expected batch
size. Only then does the algorithm's ``after_backward`` run, on the privatised gradient, and
the plain SGD step (momentum and weight decay included) follows. Whatever happens after the
noise is post-processing and costs no privacy.

How an algorithm's hooks must behave under DP (``ClientAlgorithm.dp_compatible``):

- ``extra_loss`` may only depend on the parameters through the model's forward pass on this
  batch, one term per sample (FedProto's alignment of each embedding with its class
  prototype is fine). A term on the weights themselves (FedProx's proximal term) gets no
  per-sample gradient, would be silently dropped by the clipping, and is refused: every step
  checks that the batch gradient is the mean of the per-sample gradients.
- ``after_backward`` edits ``p.grad`` after clipping and noise: it must not look at the data
  (FedProx's ``mu * (w - w_global)``, SCAFFOLD's ``c - c_i`` are fine).
- ``payload`` may use the trained weights freely (post-processing); statistics computed from
  raw data (FedProto's prototypes) must go through ``prototype_release`` (see prototypes.py).

Noise and sampling draw from generators seeded by the OS's random source: a seed an observer
could know (run id, round) would let it subtract the noise.
"""

from __future__ import annotations

import math
import secrets
import time
import warnings
from dataclasses import dataclass

import torch
from opacus.grad_sample import GradSampleHooks
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from edge_agent.algorithms.base import ClientAlgorithm
from edge_agent.data.datasets import Dataset
from edge_agent.models import FedModel
from edge_agent.privacy.errors import PrivacyUnsupported
from edge_agent.privacy.ledger import Charge
from edge_agent.sgd import SGD
from edge_agent.tasks.base import CLASSIFICATION, Objective
from edge_agent.training import TrainResult, to_tensors
from protocol.messages import LocalTraining

# Opacus's hooks on the first layer see inputs that need no gradient, and torch warns at every step.
# Filtered once, for the process: catch_warnings() is not thread-safe, and agents may share a process.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with respect "
                        "to module outputs since no inputs require gradients", category=UserWarning)

_PER_SAMPLE_TOLERANCE = 1e-4
"""Relative gap allowed between the batch gradient and the mean per-sample gradient (float32 noise)."""


@dataclass(frozen=True)
class RoundShape:
    """How many Poisson-sampled steps a round takes, and at which rate."""

    sample_rate: float
    steps: int

    @classmethod
    def of(cls, num_samples: int, batch_size: int, epochs: int, steps: int | None = None) -> RoundShape:
        """Each record joins a batch with probability ``batch_size / num_samples`` (at most 1); an epoch is
        ``num_samples / batch_size`` steps, one pass over the records in expectation, rounded to whole steps.
        ``steps`` (the plan's fixed step count, when it sets one) replaces the epochs."""
        if num_samples < 1:
            raise PrivacyUnsupported("no training samples: nothing to train under DP")
        rate = min(1.0, batch_size / num_samples)
        return cls(rate, steps if steps is not None else max(1, round(epochs / rate)))

    def charge(self, noise_multiplier: float) -> Charge:
        return Charge(noise_multiplier, self.sample_rate, self.steps)


def train_private(model: FedModel, data: Dataset, plan: LocalTraining, shape: RoundShape, charge: Charge,
                  max_grad_norm: float, device: torch.device, algorithm: ClientAlgorithm,
                  objective: Objective = CLASSIFICATION) -> TrainResult:
    """DP-SGD for ``shape.steps`` steps at ``charge``'s noise; ``charge`` must already be in the ledger."""
    started = time.perf_counter()
    hooks = GradSampleHooks(model, loss_reduction="mean")
    try:
        optimizer = DPOptimizer(
            # Ours, not torch.optim's (whose first use loads torch._dynamo): see edge_agent/sgd.py.
            SGD(model.parameters(), lr=plan.learning_rate, momentum=plan.momentum,  # type: ignore[arg-type]
                weight_decay=plan.weight_decay),
            noise_multiplier=charge.noise_multiplier, max_grad_norm=max_grad_norm,
            expected_batch_size=max(1, round(shape.sample_rate * len(data))),
            generator=_secret_generator(device),
        )
        taken: list[tuple[float, float]] = []
        # Records what every noised step actually was, as an Opacus accountant's hook would.
        optimizer.attach_step_hook(
            lambda opt: taken.append((opt.noise_multiplier, shape.sample_rate * opt.accumulated_iterations)))
        loss, accuracy = _run_steps(model, data, shape, optimizer, device, algorithm, objective)
    finally:
        hooks.cleanup()
    expected = [(charge.noise_multiplier, charge.sample_rate)] * charge.steps
    if taken != expected:
        raise RuntimeError(f"DP training took {len(taken)} noised steps where {charge.steps} were charged at "
                           f"sigma {charge.noise_multiplier}, rate {charge.sample_rate}")
    return TrainResult(loss, accuracy, shape.steps, time.perf_counter() - started)


def _run_steps(model: FedModel, data: Dataset, shape: RoundShape, optimizer: DPOptimizer, device: torch.device,
               algorithm: ClientAlgorithm, objective: Objective) -> tuple[float, float]:
    """The DP-SGD steps; returns the mean loss and accuracy over the sampled batches."""
    x, y = to_tensors(data, device)
    sampler = UniformWithReplacementSampler(num_samples=len(y), sample_rate=shape.sample_rate,
                                            generator=_secret_generator(torch.device("cpu")), steps=shape.steps)
    model.train()
    loss_sum = 0.0
    correct = seen = 0
    for indices in sampler:
        optimizer.zero_grad(set_to_none=True)
        if indices:
            index = torch.tensor(indices, device=device)
            inputs, labels = x[index], y[index]
            embeddings = model.embed(inputs)
            logits = model.head(embeddings)
            loss = objective.loss(logits, labels)
            extra = algorithm.extra_loss(model, embeddings, logits, labels)
            (loss if extra is None else loss + extra).backward()
            _check_per_sample(model, algorithm)
            _drop_non_finite_records(model)
            loss_sum += loss.item() * len(labels)
            if data.num_classes:
                correct += (logits.argmax(1) == labels).sum().item()
            seen += len(labels)
        else:
            _empty_batch(model)  # the step still happens: noise alone, and it is accounted
        if not optimizer.pre_step():
            raise RuntimeError("the DP optimizer skipped a step; privacy accounting would be wrong")
        algorithm.after_backward(model)  # on the privatised gradient: post-processing
        optimizer.original_optimizer.step()
        algorithm.after_step(model)  # data-independent too (SCAFFOLD's correction)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum / max(seen, 1), correct / max(seen, 1)


def _drop_non_finite_records(model: FedModel) -> None:
    """A record whose per-sample gradient is not finite adds nothing to the step (its rows zeroed). Opacus would clip
    it by C / inf = 0, and 0 x inf is NaN: one sampled record would make the whole noised step, and the round, NaN.
    Zeroing depends on that record alone, so the sum's sensitivity stays the clip norm."""
    samples = [p.grad_sample for p in model.parameters() if p.requires_grad and p.grad_sample is not None]
    if not samples:
        return
    # One reduction per array, not a boolean copy of every per-sample gradient: a sum is finite only if each value
    # is (one that overflows only for a huge record, whose norm would overflow too, and which adds nothing anyway).
    finite = torch.stack([torch.isfinite(s.flatten(1).sum(1)) for s in samples]).all(0)
    if not bool(finite.all()):
        for s in samples:
            s[~finite] = 0.0


def _secret_generator(device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(secrets.randbits(63))


def _empty_batch(model: FedModel) -> None:
    """Poisson sampling drew no record: zero per-sample gradients, so the step adds noise only."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)


def _check_per_sample(model: FedModel, algorithm: ClientAlgorithm) -> None:
    """The batch gradient must be the mean of the per-sample ones, or clipping would drop a term."""
    diff = total = 0.0
    for name, p in model.named_parameters():
        if not p.requires_grad or p.grad is None:
            continue
        if p.grad_sample is None:
            raise PrivacyUnsupported(f"no per-sample gradient for {name}: Opacus cannot train this layer")
        diff += (p.grad - p.grad_sample.mean(0)).pow(2).sum().item()
        total += p.grad.pow(2).sum().item()
    if math.sqrt(diff) > _PER_SAMPLE_TOLERANCE * math.sqrt(total) + 1e-7:
        raise PrivacyUnsupported(
            f"algorithm {algorithm.name!r}: part of the gradient does not come from per-sample terms of the "
            "forward pass (a loss on the weights themselves, like a proximal term?). DP-SGD would silently drop "
            "it; apply such a data-independent term to the gradient in after_backward, which under DP runs on "
            "the privatised gradient")
