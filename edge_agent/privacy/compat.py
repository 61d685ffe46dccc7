"""Refuse models that DP-SGD cannot train honestly, at start-up, with the reason and the fix."""

from __future__ import annotations

from opacus.validators import ModuleValidator
from torch import nn

_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class DPIncompatibleModel(ValueError):
    """The model cannot be trained with per-sample gradients (DP-SGD)."""


def check_dp_compatible(model: nn.Module, family: str) -> None:
    """Raise ``DPIncompatibleModel`` naming every offending layer, if Opacus's validator finds any."""
    was_training = model.training
    model.train()  # the validator also insists on training mode; that is not the model's fault
    try:
        problems = []
        for name, module in model.named_modules():
            if isinstance(module, _BATCH_NORMS):
                problems.append(
                    f"{name} ({type(module).__name__}): BatchNorm normalises each sample with statistics of the "
                    f"whole batch, so a sample's gradient depends on the others and per-sample clipping cannot "
                    f"bound its influence; use nn.GroupNorm(num_groups, {module.num_features}) instead "
                    f"(or LayerNorm / InstanceNorm without running stats)")
            elif type(module) in ModuleValidator.VALIDATORS:
                for error in ModuleValidator.VALIDATORS[type(module)](module):
                    problems.append(f"{name} ({type(module).__name__}): {error}")
    finally:
        model.train(was_training)
    if problems:
        raise DPIncompatibleModel(
            f"model family {family!r} cannot train with differential privacy (dp=true):\n  - "
            + "\n  - ".join(problems))
