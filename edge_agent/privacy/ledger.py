"""The agent's privacy accountant, kept in its state directory across reboots and runs.

The ledger holds an Opacus accountant's history (noise multiplier, sample rate, steps) and
computes epsilon from it with that accountant. Two rules make the stated epsilon defensible:

- **charge first**: a round's cost is added and written (atomically) before the round
  touches the data, so a device that loses power mid-round still counts the steps it took;
- **never reset**: the ledger belongs to the agent, not to a run. A new run, a new
  coordinator or a reboot continues from the saved history; epsilon reported never
  decreases. Only an operator deleting ``privacy.json`` starts a new budget.

A charge that would take epsilon past the budget is refused (``BudgetExhausted``), before
anything is spent.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from opacus.accountants import RDPAccountant, create_accountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.utils import get_noise_multiplier

from edge_agent.privacy.config import DPConfig, Mechanism
from edge_agent.privacy.errors import BudgetExhausted, PrivacyUnsupported
from edge_agent.state import AgentStateDir
from protocol.messages import PrivacySpent

log = logging.getLogger(__name__)

STATE_NAME = "privacy"
FORMAT_VERSION = 1
_EPSILON_SLACK = 1e-9  # float noise when comparing against a budget
_RDP_ORDERS = [*RDPAccountant.DEFAULT_ALPHAS, *range(64, 257, 4)]
"""Opacus's default orders stop at 63, too low for the few-step, large-epsilon budgets of small devices."""


@functools.lru_cache(maxsize=256)
def _rdp_per_step(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """Opacus's RDP curve of one step; RDP composes by addition, so a history costs one curve per (sigma, q)."""
    return rdp_analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=_RDP_ORDERS)


@functools.lru_cache(maxsize=64)
def _calibrate(target_epsilon: float, delta: float, sample_rate: float, steps: int, mechanism: Mechanism) -> float:
    """Opacus's noise calibration; cached, as agents with equal data sizes in one process ask the same."""
    options: dict[str, Any] = {"alphas": _RDP_ORDERS} if mechanism == "rdp" else {}
    return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                      steps=steps, accountant=mechanism, **options))


@dataclass(frozen=True)
class Charge:
    """``steps`` applications of a Gaussian mechanism with Poisson sampling at ``sample_rate``."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise multiplier must be finite and positive, got {self.noise_multiplier}")
        if not (0.0 < self.sample_rate <= 1.0):
            raise ValueError(f"sample rate must lie in (0, 1], got {self.sample_rate}")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")

    def entry(self) -> tuple[float, float, int]:
        """The form of one entry of an Opacus accountant's ``history``."""
        return (float(self.noise_multiplier), float(self.sample_rate), int(self.steps))


def _compose(history: Sequence[tuple[float, float, int]], charges: Sequence[Charge],
             mechanism: Mechanism) -> list[tuple[float, float, int]]:
    """``history`` followed by ``charges``, runs of equal (sigma, q) merged as Opacus accountants do."""
    out = list(history)
    for charge in charges:
        sigma, rate, steps = charge.entry()
        if out and out[-1][:2] == (sigma, rate):
            out[-1] = (sigma, rate, out[-1][2] + steps)
        else:
            out.append((sigma, rate, steps))
    return out


def _charge_from(raw: object) -> Charge:
    """One saved ``[sigma, sample_rate, steps]`` entry; raises ValueError or TypeError if malformed."""
    if not isinstance(raw, list) or len(raw) != 3:
        raise ValueError(f"entry {raw!r} is not [sigma, sample_rate, steps]")
    sigma, rate, steps = raw
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"steps {steps!r} is not an integer")
    return Charge(float(sigma), float(rate), steps)


class PrivacyLedger:
    def __init__(self, mechanism: Mechanism, delta: float, budget: float | None,
                 state: AgentStateDir | None = None) -> None:
        self.mechanism = mechanism
        self.delta = delta
        self.budget = budget
        self.state = state
        self.history: list[tuple[float, float, int]] = []
        self.rounds = 0
        """Rounds charged, across every run."""
        self.last_round: list[Charge] = []
        """What the last round cost, or would have cost when refused: the yardstick for whether another fits."""
        self.calibration: dict[str, Any] | None = None
        self._accountant = create_accountant(mechanism)
        self._epsilon = 0.0
        self._excess = 0.0
        """Epsilon recorded beyond what the history gives (an earlier accountant's looser bound): every
        projection adds it, so a recorded spend is never spent again."""
        self._exhausted: bool | None = None

    # -- epsilon --------------------------------------------------------------------------
    def epsilon_with(self, charges: Sequence[Charge]) -> float:
        """Epsilon at ``delta`` if ``charges`` were added to the history (nothing is recorded)."""
        return self._history_epsilon(charges) + self._excess

    def _history_epsilon(self, charges: Sequence[Charge]) -> float:
        history = _compose(self.history, charges, self.mechanism)
        if not history:
            return 0.0
        if self.mechanism == "rdp":  # what RDPAccountant.get_epsilon computes, with each curve computed once
            rdp = sum(steps * _rdp_per_step(sigma, rate) for sigma, rate, steps in history)
            return float(rdp_analysis.get_privacy_spent(orders=_RDP_ORDERS, rdp=rdp, delta=self.delta)[0])
        self._accountant.load_state_dict({"history": history, "mechanism": self.mechanism})
        return float(self._accountant.get_epsilon(delta=self.delta))

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @property
    def exhausted(self) -> bool:
        """The budget is spent, or another round like the last one would overspend it."""
        if self.budget is None:
            return False
        if self._exhausted is None:
            over = self._epsilon >= self.budget - _EPSILON_SLACK
            if not over and self.last_round:
                try:
                    over = self.epsilon_with(self.last_round) > self.budget + _EPSILON_SLACK
                except PrivacyUnsupported:
                    over = False
            self._exhausted = over
        return self._exhausted

    def spent(self) -> PrivacySpent:
        return PrivacySpent(epsilon=self._epsilon, delta=self.delta, budget_epsilon=self.budget,
                            exhausted=self.exhausted)

    # -- spending -------------------------------------------------------------------------
    def charge(self, charges: Sequence[Charge]) -> float:
        """Record one round's ``charges`` and save, or raise ``BudgetExhausted`` having spent nothing.

        A refused round becomes the yardstick of ``exhausted``: else an agent whose first round already
        overspends would never say it is spent, and be selected (and waited for) round after round."""
        projected = self.epsilon_with(charges)
        if not math.isfinite(projected):  # unbounded: no promise is left to keep, and the wire carries finite figures
            raise PrivacyUnsupported(f"the {self.mechanism} accountant bounds epsilon by {projected} after this round "
                                     f"(noise multiplier {min(c.noise_multiplier for c in charges):.4g}): raise "
                                     "dp_noise_multiplier")
        if self.budget is not None and projected > self.budget + _EPSILON_SLACK:
            if list(charges) != self.last_round:
                self.last_round, self._exhausted = list(charges), None
                self.save()
            raise BudgetExhausted(self._epsilon, projected, self.budget)
        self.history = _compose(self.history, charges, self.mechanism)
        self.rounds += 1
        self.last_round = list(charges)
        self._epsilon = max(self._epsilon, projected)
        self._exhausted = None
        self.save()
        return self._epsilon

    def noise_multiplier(self, config: DPConfig, sample_rate: float, steps_per_round: int) -> float:
        """The fixed sigma, or the one calibrated (once, then kept) to reach the target after the planned rounds."""
        if config.noise_multiplier is not None:
            return config.noise_multiplier
        if self.calibration is not None:
            return float(self.calibration["noise_multiplier"])
        assert config.target_epsilon is not None and config.planned_rounds is not None
        if self.history:
            raise PrivacyUnsupported(
                f"dp_target_epsilon calibrates the noise once, for an unspent budget, but this agent already "
                f"spent epsilon {self._epsilon:.4g}: set dp_noise_multiplier and dp_budget_epsilon instead")
        sigma = _calibrate(config.target_epsilon, self.delta, sample_rate, config.planned_rounds * steps_per_round,
                           self.mechanism)
        self.calibration = {
            "noise_multiplier": sigma, "target_epsilon": config.target_epsilon,
            "planned_rounds": config.planned_rounds, "sample_rate": sample_rate, "steps_per_round": steps_per_round,
        }
        self.save()
        log.info("calibrated noise multiplier %.4f: epsilon %.3g at delta %.3g after %d rounds of %d steps at "
                 "sample rate %.4f", sigma, config.target_epsilon, self.delta, config.planned_rounds,
                 steps_per_round, sample_rate)
        return sigma

    # -- durability -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION, "mechanism": self.mechanism, "delta": self.delta,
            "history": [list(entry) for entry in self.history], "epsilon": self._epsilon, "rounds": self.rounds,
            "last_round": [list(c.entry()) for c in self.last_round], "calibration": self.calibration,
            "updated_at": time.time(),
        }

    def save(self) -> None:
        if self.state is not None:
            self.state.write_json(STATE_NAME, self.state_dict())

    @classmethod
    def open(cls, state: AgentStateDir, config: DPConfig) -> PrivacyLedger:
        """The ledger saved in ``state``, checked against ``config``; a new one if there is none."""
        ledger = cls(config.accountant, config.delta, config.stop_epsilon, state)
        saved = state.read_json(STATE_NAME)
        if saved is None:
            if (state.root / "progress.json").exists():  # it answered rounds before: the budget was spent from
                log.warning("%s is missing but %s says this agent answered rounds before: its privacy budget "
                            "starts again from zero (the coordinator's rollback check will flag it)",
                            state.root / f"{STATE_NAME}.json", state.root / "progress.json")
            return ledger
        where = state.root / f"{STATE_NAME}.json"
        ledger.load_state_dict(saved, where)
        cal = ledger.calibration
        if cal is not None and config.target_epsilon is not None and (
                cal["target_epsilon"] != config.target_epsilon or cal["planned_rounds"] != config.planned_rounds):
            raise ValueError(
                f"{where}: the noise was calibrated for dp_target_epsilon {cal['target_epsilon']} over "
                f"dp_planned_rounds {cal['planned_rounds']}, now set to {config.target_epsilon} over "
                f"{config.planned_rounds}; a calibration is kept for the agent's life (epsilon {ledger.epsilon:.4g} "
                f"is spent): restore those settings, or set dp_noise_multiplier and dp_budget_epsilon")
        return ledger

    def load_state_dict(self, saved: dict[str, Any], where: object = "privacy state") -> None:
        """Restore a saved ledger; raises ValueError, naming what is wrong, rather than lose any spending."""
        def bad(why: str) -> ValueError:
            return ValueError(f"{where}: {why}. The privacy budget cannot be restored, so the agent will not "
                              "train; repair or restore the file (deleting it resets the budget: only for new data)")

        if saved.get("format") != FORMAT_VERSION:
            raise bad(f"unknown format {saved.get('format')!r}, expected {FORMAT_VERSION}")
        if saved.get("mechanism") == "gdp":  # no longer offered (it can under-report): recomputed, never lowered
            log.warning("%s: kept under the gdp accountant; recomputed under %s", where, self.mechanism)
        elif saved.get("mechanism") != self.mechanism:
            raise bad(f"it was spent under the {saved.get('mechanism')!r} accountant, dp_accountant is now "
                      f"{self.mechanism!r}; set dp_accountant back")
        if saved.get("delta") != self.delta:
            raise bad(f"it is stated at dp_delta {saved.get('delta')!r}, now set to {self.delta!r}; a budget "
                      "holds at one delta, set dp_delta back")
        try:
            history = [_charge_from(raw) for raw in saved["history"]]
            last_round = [_charge_from(raw) for raw in saved.get("last_round", [])]
            recorded = float(saved["epsilon"])
            rounds = int(saved["rounds"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise bad(f"malformed history ({exc})") from None
        if not (math.isfinite(recorded) and recorded >= 0) or rounds < 0:
            raise bad(f"malformed epsilon {recorded!r} or rounds {rounds!r}")
        calibration = saved.get("calibration")
        if calibration is not None:
            keys = {"noise_multiplier", "target_epsilon", "planned_rounds", "sample_rate", "steps_per_round"}
            if not isinstance(calibration, dict) or not keys <= calibration.keys():
                raise bad("malformed calibration")
            try:
                Charge(float(calibration["noise_multiplier"]), 1.0, 1)  # validates sigma
            except (TypeError, ValueError) as exc:
                raise bad(f"malformed calibration ({exc})") from None
        self.history = _compose([], history, self.mechanism)
        self.rounds, self.last_round, self.calibration = rounds, last_round, calibration
        try:  # entries each in range can still break the accountant's arithmetic (a hand-edited sigma of 1e-200)
            computed = self._history_epsilon([])
        except (ArithmeticError, TypeError, ValueError) as exc:
            raise bad(f"its history does not compute ({type(exc).__name__}: {exc})") from None
        if not math.isfinite(computed):
            raise bad(f"its history gives epsilon {computed}")
        self._excess = 0.0
        if computed < recorded * (1 - 1e-6) - _EPSILON_SLACK:
            # Never report less than was reported before (an accountant upgrade can tighten the bound), and
            # charge every later round on top of what was recorded.
            log.warning("%s: the history gives epsilon %.6g, below the %.6g recorded; keeping %.6g",
                        where, computed, recorded, recorded)
            self._excess = recorded - computed
        self._epsilon = max(computed, recorded)
        self._exhausted = None
