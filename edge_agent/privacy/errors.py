"""Why an agent with DP on does not train a round; importable without torch or Opacus."""

from __future__ import annotations


class BudgetExhausted(Exception):
    """Training would take epsilon past the budget: nothing was spent."""

    def __init__(self, spent: float, projected: float, budget: float) -> None:
        super().__init__(f"privacy budget exhausted: spent epsilon {spent:.4g}, this round would reach "
                         f"{projected:.4g}, budget {budget:.4g}")
        self.spent = spent
        self.projected = projected
        self.budget = budget


class PrivacyUnsupported(ValueError):
    """A round this agent cannot train under DP without breaking its guarantee."""
