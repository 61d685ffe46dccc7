"""edge_agent.sgd.SGD takes the same steps as torch.optim.SGD, bit for bit, without loading torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from edge_agent.sgd import SGD
from tests.chart import REPO


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))


def _train(model: nn.Module, optimizer: SGD | torch.optim.SGD, steps: int) -> None:
    generator = torch.Generator().manual_seed(3)
    for step in range(steps):
        x = torch.rand(8, 1, 8, 8, generator=generator)
        y = torch.randint(0, 10, (8,), generator=generator)
        optimizer.zero_grad(set_to_none=step % 2 == 0)
        nn.functional.cross_entropy(model(x), y).backward()
        if step == 2:  # a parameter without a gradient this step is skipped, momentum buffer included
            model[0].bias.grad = None
        optimizer.step()


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 0.0), (0.0, 1e-3), (0.5, 5e-4)])
def test_steps_equal_torch_optim_sgd(momentum: float, weight_decay: float) -> None:
    ours, reference = _model(0), _model(0)
    _train(ours, SGD(ours.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay), steps=6)
    _train(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=momentum,
                                      weight_decay=weight_decay), steps=6)
    for (name, a), (_, b) in zip(ours.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(ours[4].weight, _model(0)[4].weight)  # it did train


@pytest.mark.parametrize("bad", [{"lr": -0.1}, {"lr": float("nan")}, {"lr": 0.1, "momentum": -0.5},
                                 {"lr": 0.1, "weight_decay": -1.0}])
def test_bad_hyperparameters_name_the_field(bad: dict[str, float]) -> None:
    field = next(k for k, v in bad.items() if not v >= 0)
    with pytest.raises(ValueError, match=field):
        SGD(_model(0).parameters(), **bad)


def test_training_with_it_does_not_load_dynamo() -> None:
    code = ("import sys, torch\nfrom edge_agent.sgd import SGD\nm = torch.nn.Linear(3, 2)\n"
            "o = SGD(m.parameters(), lr=0.1, momentum=0.9)\nm(torch.ones(1, 3)).sum().backward()\no.step()\n"
            "o.zero_grad()\nprint('torch._dynamo' in sys.modules, 'sympy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.split() == ["False", "False"], done.stdout + done.stderr
