"""Plain SGD with momentum and weight decay, computed as ``torch.optim.SGD`` computes it, without torch.optim.

Every ``torch.optim`` optimizer imports ``torch._dynamo`` (and with it sympy and the rest of the
compiler stack) the first time it is built or stepped, to mark its methods as not compilable:
about 75 MB resident that an agent training in eager mode never uses (bench/memory.py). This is
``torch.optim.SGD``'s single-tensor update (dampening 0, no Nesterov), in the same order of
operations, so a round gives the same weights bit for bit (tests/unit/edge_agent/test_sgd.py).
Opacus's ``DPOptimizer`` wraps it as it would a torch optimizer: it reads only ``param_groups``
(and ``state``, ``defaults``), calls ``zero_grad`` and leaves ``step`` to the caller.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class SGD:
    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if not value >= 0.0:  # also refuses NaN
                raise ValueError(f"SGD: {name} must be >= 0, got {value}")
        self.params = list(params)
        if not self.params:
            raise ValueError("SGD: no parameters to optimise")
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self._buffers: list[torch.Tensor | None] = [None] * len(self.params)
        """Momentum buffers, made on a parameter's first step with a gradient (as torch.optim does)."""
        self.defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        self.param_groups = [{"params": self.params, **self.defaults}]
        """What an optimizer wrapper (Opacus) reads; changing a group's values does not change the steps."""
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:  # torch.optim skips such a parameter, its momentum buffer included
                continue
            grad = p.grad
            if self.weight_decay != 0:
                grad = grad.add(p, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = self._buffers[i]
                if buf is None:
                    buf = self._buffers[i] = torch.clone(grad).detach()
                else:
                    buf.mul_(self.momentum).add_(grad, alpha=1.0)
                grad = buf
            p.add_(grad, alpha=-self.lr)
