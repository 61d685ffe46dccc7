"""protocol/secagg/accounting.py turns the Gaussian mechanism's RDP into epsilon as Opacus does: checked against
Opacus itself, an agent-side dependency (the coordinator's tests run without it)."""

from __future__ import annotations

import pytest
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from protocol.secagg.accounting import ORDERS, epsilon_of, gaussian_rdp


@pytest.mark.parametrize("noise_multiplier, rounds", [(1.0, 1), (5.0, 20), (12.0, 200)])
def test_epsilon_matches_opacus_for_the_unsampled_gaussian(noise_multiplier: float, rounds: int) -> None:
    ours = epsilon_of(gaussian_rdp(noise_multiplier, rounds), 1e-5)
    rdp = compute_rdp(q=1.0, noise_multiplier=noise_multiplier, steps=rounds, orders=ORDERS.tolist())
    theirs = get_privacy_spent(orders=ORDERS.tolist(), rdp=rdp, delta=1e-5)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-9) and ours[1] == theirs[1]
