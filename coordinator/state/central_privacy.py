"""The coordinator's privacy ledger for distributed DP: what the released sums of secure rounds cost together.

Each secure round under ``secagg_noise_multiplier`` z that releases its sums spends one mechanism: Gaussian of
noise multiplier z, or Skellam on the round's grid (``protocol.secagg.accounting``). The ledger keeps the summed RDP curve; its state is part of
the checkpoint, checked when loaded: a budget must survive restarts, so a state that does not fit this ledger
fails the start, naming what is wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol.secagg.accounting import ORDERS, epsilon_of


class CentralPrivacyLedger:
    """Rounds of released noisy sums, and their summed RDP curve."""

    def __init__(self, delta: float) -> None:
        epsilon_of(np.zeros_like(ORDERS), delta)  # checks delta
        self.delta = delta
        self.rounds = 0
        self.rdp = np.zeros_like(ORDERS)

    def spend(self, rdp: np.ndarray) -> None:
        """One round's sums were released at this RDP curve (at ``ORDERS``)."""
        if rdp.shape != ORDERS.shape or not np.all(np.isfinite(rdp)) or np.any(rdp < 0):
            raise ValueError("a round's RDP curve must be finite and >= 0 at every order")
        self.rdp = self.rdp + rdp
        self.rounds += 1

    @property
    def epsilon(self) -> float:
        return epsilon_of(self.rdp, self.delta)[0]

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "orders": ORDERS.tolist(), "rdp": self.rdp.tolist()}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        """Restore a checkpointed ledger; ValueError (naming what) for one that does not fit."""
        try:
            rounds, orders, rdp = int(data["rounds"]), np.asarray(data["orders"], float), np.asarray(data["rdp"], float)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"central privacy ledger: unreadable state ({exc})") from exc
        if orders.shape != ORDERS.shape or not np.allclose(orders, ORDERS):
            raise ValueError("central privacy ledger: its Renyi orders are not this version's")
        if rounds < 0 or rdp.shape != ORDERS.shape or not np.all(np.isfinite(rdp)) or np.any(rdp < 0):
            raise ValueError(f"central privacy ledger: {rounds} rounds with an RDP curve that is not finite and >= 0")
        if rounds == 0 and np.any(rdp > 0):
            raise ValueError("central privacy ledger: a cost without any round")
        self.rounds, self.rdp = rounds, rdp
