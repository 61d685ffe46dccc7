"""FedProx on the agent, through the real worker and training loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from protocol.errors import ProtocolError
from tests.unit.edge_agent.rounds import announce, digits_subset, global_state, global_weights, make_worker


def norm(arrays: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(a.astype(np.float64) ** 2) for a in arrays.values())))


@pytest.mark.parametrize("bootstrap", [False, True], ids=["from-global-state", "bootstrap"])
def test_mu_zero_is_bit_identical_to_fedavg(tmp_path: Path, bootstrap: bool) -> None:
    data = digits_subset()
    state = None if bootstrap else global_state("cnn_small", 2, weights=global_weights("cnn_small"))
    fedavg = make_worker(tmp_path / "a", data).answer(announce("fedavg", 2, state), state)
    fedprox = make_worker(tmp_path / "b", data).answer(announce("fedprox", 2, state, params={"mu": 0.0}), state)
    field = "weights" if bootstrap else "delta"
    ours, theirs = getattr(fedprox, field), getattr(fedavg, field)
    assert ours.keys() == theirs.keys() and ours
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype
        assert ours[name].tobytes() == theirs[name].tobytes(), name
    assert fedprox.metrics.train_loss == fedavg.metrics.train_loss


def test_a_positive_mu_pulls_towards_the_global_weights(tmp_path: Path) -> None:
    data = digits_subset()
    state = global_state("cnn_small", 2, weights=global_weights("cnn_small"))
    plain = make_worker(tmp_path / "a", data).answer(announce("fedprox", 2, state, params={"mu": 0.0}), state)
    pulled = make_worker(tmp_path / "b", data).answer(announce("fedprox", 2, state, params={"mu": 5.0}), state)
    assert norm(pulled.delta) < 0.8 * norm(plain.delta)


@pytest.mark.parametrize("params", [{}, {"mu": -1.0}, {"mu": 0.1, "other": 1}])
def test_bad_parameters_are_refused_naming_them(tmp_path: Path, params: dict) -> None:
    data = digits_subset(per_class=2)
    with pytest.raises(ProtocolError, match="fedprox parameter"):
        make_worker(tmp_path, data).answer(announce("fedprox", 1, params=params), None)
