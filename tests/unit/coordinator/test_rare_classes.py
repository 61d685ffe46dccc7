"""KL weighting's rare-class protection: starved classes get their weight back, liars gain at most the bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator.telemetry.heterogeneity import LabelSkew
from coordinator.telemetry.rare_classes import CLASS_PROTECTION, Protection, class_weight_ratios, protect, shares


def kl_factors(counts: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """exp(-KL(p_k || q) / T) by hand, q the add-one-smoothed federation distribution."""
    total = counts.sum(axis=0)
    q = (total + 1.0) / (total.sum() + counts.shape[1])
    out = []
    for row in counts:
        p = row / row.sum()
        out.append(math.exp(-sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True) if pi > 0) / temperature))
    return np.array(out)


def protected(counts: np.ndarray, protection: float = CLASS_PROTECTION, chunk: int = 2) -> tuple[Protection, np.ndarray]:
    """protect() over ``counts`` fed in chunks of ``chunk`` rows; the protection and every row's factor."""
    plain = kl_factors(counts)
    samples = counts.sum(axis=1).astype(np.float64)

    def chunks():  # type: ignore[no-untyped-def]
        for start in range(0, len(counts), chunk):
            yield samples[start:start + chunk], plain[start:start + chunk], counts[start:start + chunk]

    result = protect(chunks, counts.sum(axis=0), 0, protection)
    return result, result.factors(plain, counts)


def relative_weights(counts: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """What the aggregator gives each agent: n_k f_k renormalised."""
    weighted = counts.sum(axis=1) * factors
    return weighted / weighted.sum()


# Like Dirichlet(0.1): agent 3 alone holds class 3; agents 4 and 5, both one-class, split class 4.
FLEET = np.array([
    [40, 30, 30, 0, 0],
    [30, 40, 30, 0, 0],
    [35, 35, 30, 0, 1],
    [0, 0, 2, 60, 0],
    [0, 0, 0, 0, 30],
    [0, 1, 0, 0, 29],
])


def test_shares_by_hand() -> None:
    s = shares(FLEET, FLEET.sum(axis=0))
    assert s[3, 3] == 1.0 and s[4, 4] == pytest.approx(0.5) and s[0, 0] == pytest.approx(40 / 105)
    assert shares(np.zeros((2, 3)), np.zeros(3)) == pytest.approx(np.zeros((2, 3)))  # no totals: no share


def test_unprotected_kl_weighting_starves_the_classes_of_one_class_agents() -> None:
    ratios = class_weight_ratios(FLEET, kl_factors(FLEET))
    assert ratios[3] < 0.5 and ratios[4] < 0.5  # the flag: under half their sample-weighting weight


def test_starved_classes_get_back_the_protected_part_of_their_sample_weighting_weight() -> None:
    plain = kl_factors(FLEET)
    result, factors = protected(FLEET)
    samples = FLEET.sum(axis=1)
    # the fixed point: the mean is the sample-weighted mean of the protected factors
    assert result.mean == pytest.approx(float(samples @ factors / samples.sum()), rel=1e-6)
    # no class under CLASS_PROTECTION of its sample-weighting weight (up to a stray sample's holder at its own f)
    assert class_weight_ratios(FLEET, factors).min() >= CLASS_PROTECTION - 0.01
    # the sole holder of class 3 weighs CLASS_PROTECTION of what sample weighting gives it
    assert relative_weights(FLEET, factors)[3] == pytest.approx(CLASS_PROTECTION * samples[3] / samples.sum(), rel=1e-5)
    assert (factors[3:] > plain[3:]).all()
    assert (factors >= plain - 1e-12).all()  # a top-up never lowers a factor
    # at a lower protection only classes 3 and 4 are starved: the balanced agents keep their plain factors
    _, partial = protected(FLEET, protection=0.5)
    assert partial[:3] == pytest.approx(plain[:3]) and (partial[3:] > plain[3:]).all()


def test_a_class_kl_weighting_does_not_starve_is_left_alone() -> None:
    mirrored = np.array([[90, 10], [10, 90], [50, 50]])
    _, factors = protected(mirrored)
    assert factors == pytest.approx(kl_factors(mirrored))


def test_protection_zero_is_plain_kl_and_chunking_changes_nothing() -> None:
    _, factors = protected(FLEET, protection=0.0)
    assert factors == pytest.approx(kl_factors(FLEET))
    assert protected(FLEET, chunk=1)[1] == pytest.approx(protected(FLEET, chunk=len(FLEET))[1], rel=1e-7)
    with pytest.raises(ValueError, match="protection"):
        protected(FLEET, protection=1.5)


def test_every_agent_a_sole_holder_is_sample_weighting() -> None:
    disjoint = np.diag([50, 80, 20])
    _, factors = protected(disjoint, protection=1.0)
    assert relative_weights(disjoint, factors) == pytest.approx(disjoint.sum(axis=1) / disjoint.sum(), rel=1e-5)


@pytest.mark.parametrize("claim", [
    [1, 1, 1, 60, 1],          # a few of every class, most of the honest sole holder's class
    [500, 500, 500, 500, 500],  # a huge claim of every class
    [0, 0, 0, 60, 0],          # a copy of the sole holder
    [0, 0, 0, 1, 0],           # one sample of the rare class
])
def test_a_lying_agent_gains_at_most_its_sample_weighting_share(claim: list[int]) -> None:
    fleet = np.vstack([FLEET, claim])
    plain = kl_factors(fleet)
    result, factors = protected(fleet)
    samples = fleet.sum(axis=1)
    liar = len(fleet) - 1
    # a top-up never lifts it past the mean: the share n_k / N of its (claimed, capped) samples that
    # sample weighting gives it; only a low KL (its own claim) can do more, as without protection
    assert factors[liar] <= max(plain[liar], result.mean) + 1e-12
    if factors[liar] > plain[liar]:
        assert relative_weights(fleet, factors)[liar] <= samples[liar] / samples.sum() + 1e-9
    assert factors[3] >= plain[3] - 1e-12  # a diluted honest holder keeps at least its plain factor


def test_label_skew_applies_the_protection_and_follows_changes() -> None:
    def fill(skew: LabelSkew, fleet: np.ndarray) -> None:
        for i, row in enumerate(fleet):
            skew.observe(f"a{i}", device="rpi", num_samples=int(row.sum()), label_counts=row.astype(np.int64))

    skew, unprotected = LabelSkew(), LabelSkew(protection=0.0)
    fill(skew, FLEET)
    fill(unprotected, FLEET)
    _, expected = protected(FLEET)
    assert [skew.weight_factor(f"a{i}", 1.0) for i in range(len(FLEET))] == pytest.approx(expected)
    weighting = skew.weighting_summary(1.0)
    assert weighting.factor_min == pytest.approx(expected.min())
    assert weighting.class_ratio_min == pytest.approx(np.nanmin(class_weight_ratios(FLEET, expected)))
    assert weighting.class_ratio_min >= CLASS_PROTECTION - 0.01
    assert [unprotected.weight_factor(f"a{i}", 1.0) for i in range(len(FLEET))] == pytest.approx(kl_factors(FLEET))
    starved = unprotected.weighting_summary(1.0)
    assert starved.class_ratio_min is not None and starved.class_ratio_min < 0.5 and starved.class_ratio_argmin in (3, 4)
    # a repeated status changes nothing; a new holder of class 3 does, and the cache follows
    before = skew.weight_factor("a3", 1.0)
    skew.observe("a3", device="jetson", num_samples=62, label_counts=FLEET[3].astype(np.int64))
    assert skew.weight_factor("a3", 1.0) == before
    skew.observe("a6", device="rpi", num_samples=60, label_counts=np.array([0, 0, 0, 60, 0], dtype=np.int64))
    assert skew.weight_factor("a3", 1.0) < before
