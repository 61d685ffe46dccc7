"""Honest agents of one family propose the same first state, byte for byte (issue 22, item 5).

The coordinator takes a family's first state from what a strict majority of its agents sent alike
(coordinator/strategies/bootstrap.py): that only works because a bootstrap proposal is the model
built from the announced ``init_seed``, untrained, whatever data, device or algorithm the agent has.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_agent.tasks.registry import resolve_task
from edge_agent.weights import get_arrays
from protocol.digest import digest_arrays
from protocol.tasks import BUILTIN_CARDS

from .rounds import announce, digits_subset, make_worker


@pytest.mark.parametrize(("task", "family"), [(t, f) for t, card in BUILTIN_CARDS.items() for f in card.families])
def test_every_builtin_family_builds_the_same_initial_weights_from_one_seed(task: str, family: str) -> None:
    built = resolve_task(task)
    first = get_arrays(built.build_model(family, seed=11))
    torch.manual_seed(12345)  # whatever the global generator did in between
    torch.rand(1000)
    second = get_arrays(built.build_model(family, seed=11))
    assert digest_arrays([("w", first)]) == digest_arrays([("w", second)])
    other = get_arrays(built.build_model(family, seed=12))
    assert digest_arrays([("w", first)]) != digest_arrays([("w", other)])


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold"])
@pytest.mark.parametrize("family", ["mlp_tiny", "cnn_small"])
def test_two_agents_with_different_data_propose_the_same_bytes(tmp_path: Path, algorithm: str, family: str) -> None:
    params = {"mu": 0.1} if algorithm == "fedprox" else {}
    momentum = 0.0 if algorithm == "scaffold" else 0.9
    proposals = []
    for agent, classes in (("agent-0", [0, 1, 2, 3, 4]), ("agent-1", [5, 6, 7, 8, 9])):
        worker = make_worker(tmp_path / agent, digits_subset(classes, seed=int(agent[-1])), family, agent_id=agent)
        update = worker.answer(announce(algorithm, 1, params=params, momentum=momentum, selected=[agent]), None)
        proposals.append(update)
    fields = ["weights", "control_delta"] if algorithm == "scaffold" else ["weights"]
    digests = {digest_arrays([(f, getattr(u, f)) for f in fields]) for u in proposals}
    assert len(digests) == 1, "honest proposals differ: the coordinator could never agree on them"
    initial = get_arrays(resolve_task("digits").build_model(family, seed=0))  # announce() sends init_seed=0
    assert all(proposals[0].weights[k].tobytes() == v.tobytes() for k, v in initial.items())
    assert proposals[0].metrics.steps == 0  # nothing trained: nothing of the data is in a proposal
    if algorithm == "scaffold":
        assert not any(np.any(a) for a in proposals[0].control_delta.values())
