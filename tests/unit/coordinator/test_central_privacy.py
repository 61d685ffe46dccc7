"""Distributed DP's ledger (coordinator/state/central_privacy.py, protocol/secagg/accounting.py): the Gaussian
mechanism's RDP composed over rounds, how many rounds a target affords, and a state that restores only when it
fits. The epsilon itself is checked against Opacus in tests/unit/edge_agent/test_secagg_accounting.py (these
tests also run without torch and Opacus)."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.state.central_privacy import CentralPrivacyLedger
from protocol.secagg.accounting import ORDERS, affordable_rounds, epsilon_of, gaussian_rdp


def test_the_ledger_composes_rounds_and_a_target_affords_what_it_says() -> None:
    ledger = CentralPrivacyLedger(1e-5)
    for _ in range(30):
        ledger.spend(8.0)
    assert ledger.rounds == 30 and ledger.epsilon == pytest.approx(epsilon_of(gaussian_rdp(8.0, 30), 1e-5)[0])
    affordable = affordable_rounds(8.0, 1e-5, 3.0)
    assert epsilon_of(gaussian_rdp(8.0, affordable), 1e-5)[0] <= 3.0 < epsilon_of(gaussian_rdp(8.0, affordable + 1),
                                                                                     1e-5)[0]
    assert affordable_rounds(1.0, 1e-5, 3.0) == 0  # one round at z = 1 already costs more than 3


def test_a_saved_ledger_restores_and_one_that_does_not_fit_fails_naming_why() -> None:
    ledger = CentralPrivacyLedger(1e-5)
    ledger.spend(4.0), ledger.spend(2.0)
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
