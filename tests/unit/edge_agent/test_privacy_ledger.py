"""The durable privacy ledger: epsilon from Opacus accountants, budgets, and restores that lose nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from edge_agent.privacy.config import DPConfig
from edge_agent.privacy.errors import BudgetExhausted, PrivacyUnsupported
from edge_agent.privacy.ledger import _RDP_ORDERS, Charge, PrivacyLedger
from edge_agent.state import AgentStateDir

ROUND = Charge(noise_multiplier=1.1, sample_rate=0.25, steps=8)


def fixed(budget: float | None = None, **kw: object) -> DPConfig:
    return DPConfig(noise_multiplier=1.1, budget_epsilon=budget, **kw)  # type: ignore[arg-type]


def test_epsilon_is_opacus_rdp_of_every_step_taken(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), fixed())
    other = Charge(2.0, 0.5, 3)
    ledger.charge([ROUND])
    ledger.charge([ROUND, other])
    reference = RDPAccountant()
    for charge in (ROUND, ROUND, other):
        for _ in range(charge.steps):
            reference.step(noise_multiplier=charge.noise_multiplier, sample_rate=charge.sample_rate)
    assert ledger.history == reference.history  # runs of equal steps merged exactly as Opacus does
    assert ledger.epsilon == pytest.approx(reference.get_epsilon(delta=1e-5, alphas=_RDP_ORDERS), rel=1e-9)
    assert ledger.epsilon <= reference.get_epsilon(delta=1e-5) + 1e-12  # more orders only tighten the bound
    assert ledger.rounds == 2


def test_epsilon_grows_with_every_round(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), fixed())
    seen = [ledger.epsilon]
    for _ in range(4):
        seen.append(ledger.charge([ROUND]))
    assert seen == sorted(seen) and len(set(seen)) == 5


def test_reopened_ledger_continues_from_the_saved_history(tmp_path: Path) -> None:
    state = AgentStateDir(tmp_path)
    first = PrivacyLedger.open(state, fixed())
    first.charge([ROUND])
    first.charge([ROUND])
    again = PrivacyLedger.open(AgentStateDir(tmp_path), fixed())
    assert again.epsilon == first.epsilon > 0
    assert again.history == first.history and again.rounds == 2
    assert again.charge([ROUND]) > first.epsilon


def test_a_round_past_the_budget_is_refused_and_spends_nothing(tmp_path: Path) -> None:
    state = AgentStateDir(tmp_path)
    one_round = PrivacyLedger("rdp", 1e-5, None).epsilon_with([ROUND])
    ledger = PrivacyLedger.open(state, fixed(budget=one_round * 1.2))
    ledger.charge([ROUND])
    saved = (tmp_path / "privacy.json").read_bytes()
    assert ledger.exhausted  # a second round like the first would not fit
    with pytest.raises(BudgetExhausted) as refused:
        ledger.charge([ROUND])
    assert refused.value.projected > refused.value.budget >= refused.value.spent
    assert ledger.rounds == 1 and (tmp_path / "privacy.json").read_bytes() == saved
    assert ledger.spent().exhausted and ledger.spent().epsilon == pytest.approx(one_round)


def test_a_first_round_past_the_budget_marks_the_ledger_spent_across_a_restart(tmp_path: Path) -> None:
    # Nothing was ever charged, so no last round says whether another fits: the refused one must.
    state = AgentStateDir(tmp_path)
    one_round = PrivacyLedger("rdp", 1e-5, None).epsilon_with([ROUND])
    ledger = PrivacyLedger.open(state, fixed(budget=one_round * 0.5))
    assert not ledger.exhausted
    with pytest.raises(BudgetExhausted):
        ledger.charge([ROUND])
    assert ledger.exhausted and ledger.spent().exhausted
    assert ledger.rounds == 0 and ledger.epsilon == 0.0 and ledger.history == []  # nothing spent
    reopened = PrivacyLedger.open(state, fixed(budget=one_round * 0.5))
    assert reopened.exhausted and reopened.epsilon == 0.0


def test_target_epsilon_is_calibrated_once_and_fits_exactly_the_planned_rounds(tmp_path: Path) -> None:
    config = DPConfig(target_epsilon=3.0, planned_rounds=4)
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), config)
    sigma = ledger.noise_multiplier(config, sample_rate=0.25, steps_per_round=8)
    assert sigma == pytest.approx(get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=0.25,
                                                       steps=32, accountant="rdp"), rel=0.05)
    for _ in range(4):
        assert not ledger.exhausted
        ledger.charge([Charge(sigma, 0.25, 8)])
    assert 2.9 < ledger.epsilon <= 3.0 and ledger.exhausted
    with pytest.raises(BudgetExhausted):
        ledger.charge([Charge(sigma, 0.25, 8)])
    # The calibration is kept: a restart with other data sizes does not re-calibrate.
    again = PrivacyLedger.open(AgentStateDir(tmp_path), config)
    assert again.noise_multiplier(config, sample_rate=0.5, steps_per_round=2) == sigma


def test_changed_target_after_calibration_fails_at_start_naming_the_settings(tmp_path: Path) -> None:
    config = DPConfig(target_epsilon=3.0, planned_rounds=4)
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), config)
    ledger.charge([Charge(ledger.noise_multiplier(config, 0.25, 8), 0.25, 8)])
    with pytest.raises(ValueError, match="dp_target_epsilon 3.0 over dp_planned_rounds 4"):
        PrivacyLedger.open(AgentStateDir(tmp_path), DPConfig(target_epsilon=8.0, planned_rounds=4))


def test_calibration_refused_once_budget_was_spent_without_it(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), fixed())
    ledger.charge([ROUND])
    config = DPConfig(target_epsilon=8.0, planned_rounds=4)
    reopened = PrivacyLedger.open(AgentStateDir(tmp_path), config)
    with pytest.raises(PrivacyUnsupported, match="already spent"):
        reopened.noise_multiplier(config, 0.25, 8)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(mechanism="prv"), "dp_accountant"),
    (lambda d: d.update(delta=1e-6), "dp_delta"),
    (lambda d: d.update(history=[[1.1, 0.25, "8"]]), "malformed history"),
    (lambda d: d.update(history=[[0.0, 0.25, 8]]), "malformed history"),
    (lambda d: d.update(history=[[1.1, 1.5, 8]]), "malformed history"),
    (lambda d: d.update(epsilon=float("nan")), "malformed"),
    (lambda d: d.pop("history"), "malformed history"),
    (lambda d: d.update(format=99), "unknown format"),
])
def test_a_damaged_ledger_stops_the_agent_instead_of_resetting(tmp_path: Path, edit, message: str) -> None:
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), fixed())
    ledger.charge([ROUND])
    path = tmp_path / "privacy.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        PrivacyLedger.open(AgentStateDir(tmp_path), fixed())


def test_unreadable_ledger_is_an_error_not_a_fresh_budget(tmp_path: Path) -> None:
    (tmp_path / "privacy.json").write_text('{"format": 1, "hist')
    with pytest.raises(ValueError, match="corrupt"):
        PrivacyLedger.open(AgentStateDir(tmp_path), fixed())


def test_reported_epsilon_never_drops_below_what_was_recorded(tmp_path: Path) -> None:
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), fixed())
    ledger.charge([ROUND])
    path = tmp_path / "privacy.json"
    data = json.loads(path.read_text())
    data["epsilon"] = ledger.epsilon + 1.0  # e.g. recorded by an older, looser accountant
    path.write_text(json.dumps(data))
    assert PrivacyLedger.open(AgentStateDir(tmp_path), fixed()).epsilon == pytest.approx(ledger.epsilon + 1.0)


def test_a_recorded_spend_above_the_history_is_charged_on_top_of(tmp_path: Path) -> None:
    """A ledger whose recorded epsilon exceeds what its history gives (an older, looser accountant) is exhausted
    at that figure: the next round is refused, and a round that fits is charged above the recorded spend."""
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), fixed(budget=6.0))
    ledger.charge([ROUND])
    path = tmp_path / "privacy.json"
    data = json.loads(path.read_text())
    data["epsilon"] = 6.0
    path.write_text(json.dumps(data))
    reopened = PrivacyLedger.open(AgentStateDir(tmp_path), fixed(budget=6.0))
    assert reopened.exhausted and reopened.epsilon == pytest.approx(6.0)
    with pytest.raises(BudgetExhausted):
        reopened.charge([Charge(5.0, 0.01, 10)])  # tiny on its own, but the budget is spent
    roomy = PrivacyLedger.open(AgentStateDir(tmp_path), fixed(budget=100.0))
    assert roomy.charge([Charge(5.0, 0.01, 10)]) > 6.0


def test_a_ledger_kept_under_gdp_is_recomputed_and_never_lowered(tmp_path: Path) -> None:
    """gdp (a central-limit approximation that can under-report) is no longer offered; a ledger an older agent kept
    under it reopens under rdp, its epsilon the larger of the recorded and the recomputed one (review: gdp reported
    1.06 for one step whose true epsilon at delta 1e-5 is about 2.3)."""
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), fixed())
    ledger.charge([ROUND])
    path = tmp_path / "privacy.json"
    saved = json.loads(path.read_text())
    rdp = saved["epsilon"]
    path.write_text(json.dumps({**saved, "mechanism": "gdp", "epsilon": rdp / 2}))  # gdp's lower figure
    assert PrivacyLedger.open(AgentStateDir(tmp_path), fixed()).epsilon == pytest.approx(rdp)
    path.write_text(json.dumps({**saved, "mechanism": "gdp", "epsilon": rdp * 2}))  # a larger recorded one is kept
    assert PrivacyLedger.open(AgentStateDir(tmp_path), fixed()).epsilon == pytest.approx(rdp * 2)


@pytest.mark.parametrize("history", [[[1e-200, 0.25, 8]], [[1e300, 0.25, 8]]], ids=["tiny-sigma", "huge-sigma"])
def test_a_history_that_does_not_compute_is_refused_naming_the_file(tmp_path: Path, history: list) -> None:
    """Entries each in range can break the accountant's arithmetic (ZeroDivisionError, OverflowError): a ValueError
    naming privacy.json, which the CLI prints as one line (found in review)."""
    PrivacyLedger.open(AgentStateDir(tmp_path), fixed(budget=50.0)).charge([ROUND])
    path = tmp_path / "privacy.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "history": history}))
    with pytest.raises(ValueError, match="privacy.json"):
        PrivacyLedger.open(AgentStateDir(tmp_path), fixed(budget=50.0))


def test_a_round_whose_epsilon_is_unbounded_is_refused_and_nothing_is_saved(tmp_path: Path) -> None:
    """Without a budget the accountant's answer may be infinite (prv, noise 0.05): saved, it made every status fail
    (the wire carries finite figures) and the next start refuse the agent's own ledger (found in review)."""
    config = DPConfig(noise_multiplier=0.05, accountant="prv")
    ledger = PrivacyLedger.open(AgentStateDir(tmp_path), config)
    with pytest.raises(PrivacyUnsupported, match="dp_noise_multiplier"):
        ledger.charge([Charge(0.05, 0.25, 8)])
    assert ledger.epsilon == 0.0 and ledger.spent().epsilon == 0.0
    assert PrivacyLedger.open(AgentStateDir(tmp_path), config).epsilon == 0.0


def test_prv_accountant_is_tighter_than_rdp(tmp_path: Path) -> None:
    rdp = PrivacyLedger.open(AgentStateDir(tmp_path / "rdp"), fixed())
    prv = PrivacyLedger.open(AgentStateDir(tmp_path / "prv"), fixed(accountant="prv"))
    assert 0 < prv.charge([ROUND] * 3) < rdp.charge([ROUND] * 3)
