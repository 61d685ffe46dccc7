"""Distributed DP's ledger (coordinator/state/central_privacy.py, protocol/secagg/accounting.py): the Gaussian and
Skellam mechanisms' RDP composed over rounds, how many rounds a target affords, and a state that restores only when it
fits. The epsilon itself is checked against Opacus in tests/unit/edge_agent/test_secagg_accounting.py (these
tests also run without torch and Opacus)."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.state.central_privacy import CentralPrivacyLedger
from protocol.secagg.accounting import (
    ORDERS,
    SKELLAM_MIN_STEPS,
    affordable_rounds,
    epsilon_of,
    gaussian_rdp,
    skellam_family_rdp,
    skellam_rdp,
    skellam_round_bound,
)


def test_the_ledger_composes_rounds_and_a_target_affords_what_it_says() -> None:
    ledger = CentralPrivacyLedger(1e-5)
    for _ in range(30):
        ledger.spend(gaussian_rdp(8.0))
    assert ledger.rounds == 30 and ledger.epsilon == pytest.approx(epsilon_of(gaussian_rdp(8.0, 30), 1e-5)[0])
    affordable = affordable_rounds(gaussian_rdp(8.0), 1e-5, 3.0)
    assert epsilon_of(gaussian_rdp(8.0, affordable), 1e-5)[0] <= 3.0 < epsilon_of(gaussian_rdp(8.0, affordable + 1),
                                                                                     1e-5)[0]
    assert affordable_rounds(gaussian_rdp(1.0), 1e-5, 3.0) == 0  # one round at z = 1 already costs more than 3
    with pytest.raises(ValueError, match="finite and >= 0"):
        ledger.spend(np.full(3, 1.0))


def test_a_saved_ledger_restores_and_one_that_does_not_fit_fails_naming_why() -> None:
    ledger = CentralPrivacyLedger(1e-5)
    ledger.spend(gaussian_rdp(4.0)), ledger.spend(skellam_round_bound(2.0))
    again = CentralPrivacyLedger(1e-5)
    again.load_state_dict(ledger.state_dict())
    assert again.rounds == 2 and again.epsilon == ledger.epsilon
    state = ledger.state_dict()
    for broken, named in [({**state, "orders": state["orders"][:-1]}, "orders"),
                          ({**state, "rdp": [-1.0] * len(ORDERS)}, "not finite and >= 0"),
                          ({**state, "rounds": 0}, "a cost without any round"),
                          ({"rounds": 1}, "unreadable")]:
        with pytest.raises(ValueError, match=named):
            CentralPrivacyLedger(1e-5).load_state_dict(broken)
    with pytest.raises(ValueError, match="delta"):
        CentralPrivacyLedger(1.5)
    assert np.all(gaussian_rdp(3.0, 0) == 0)


def test_skellam_costs_what_the_theorem_bounds_and_tends_to_the_gaussian_on_a_fine_grid() -> None:
    # Agarwal, Kairouz and Liu (2021), Theorem 3.5, by hand at order 2 for D2 = 10, D1 = 30, variance 400.
    expected = 2 * 100 / (2 * 400) + min((3 * 100 + 6 * 30) / (4 * 400**2), 3 * 30 / (2 * 400))
    assert skellam_rdp(10.0, 30.0, 400.0)[list(ORDERS).index(2.0)] == pytest.approx(expected)
    # A fractional order takes the next integer's bound; rounds add up.
    assert skellam_rdp(10.0, 30.0, 400.0)[list(ORDERS).index(1.5)] == pytest.approx(expected)
    assert np.allclose(skellam_rdp(10.0, 30.0, 400.0, rounds=7), 7 * skellam_rdp(10.0, 30.0, 400.0))
    # On a grid of 10^6 steps per unit of clip norm the rounding and the second term vanish: the Gaussian's cost.
    for z in (0.5, 1.0, 4.0):
        fine = epsilon_of(skellam_family_rdp(z, 1.0, 1e6, 127_000), 1e-5)[0]
        gaussian = epsilon_of(gaussian_rdp(z), 1e-5)[0]
        assert gaussian <= fine <= gaussian * 1.01
    # A coarse grid pays for its rounding: 10 steps per clip norm over 10,000 values is mostly rounding.
    coarse = epsilon_of(skellam_family_rdp(1.0, 1.0, 10.0, 10_000), 1e-5)[0]
    assert coarse > 5 * epsilon_of(gaussian_rdp(1.0), 1e-5)[0]  # D2 = 10 + sqrt(10,000) / 2: six times the clip
    with pytest.raises(ValueError, match="variance > 0"):
        skellam_rdp(1.0, 1.0, 0.0)


@pytest.mark.parametrize("z", [0.3, 1.0, 5.0])
def test_the_start_up_bound_covers_every_grid_a_skellam_round_may_run_on(z: float) -> None:
    bound = skellam_round_bound(z)
    for values in (1, 10, 1000, 127_000, 10_000_000):
        for factor in (1.0, 1.7, 40.0, 1e4):  # grids at and above the finest the plan refuses
            scale = factor * SKELLAM_MIN_STEPS * np.sqrt(values)
            assert np.all(skellam_family_rdp(z, 1.0, scale, values) <= bound * (1 + 1e-12))
    assert affordable_rounds(bound, 1e-5, 10.0) <= affordable_rounds(gaussian_rdp(z), 1e-5, 10.0)
