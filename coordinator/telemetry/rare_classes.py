"""Rare-class protection for KL weighting: no class may lose the weight sample weighting gives it.

``exp(-KL / T)`` shrinks skewed agents. Under strong skew (Dirichlet 0.1) one or two skewed agents
may hold nearly all of a class; shrinking them shrinks the class, and the global model can stop
predicting it at all (issue 26: digit 2, split 60/58 between two one-class agents, fell to 0%).

With ``s_kc = n_kc / S_c`` (agent k's share of class c's federation-wide count) and ``m`` the
federation's sample-weighted mean factor, class c's weight relative to sample weighting is
``r_c = sum_k w_k s_kc / m`` (1 for every class under sample weighting). Each class below
``protection`` (rho) gets a top-up shared by its holders in proportion to their share:

    delta_c  = max(0, rho * m - sum_k f_k s_kc) / sum_k s_kc^2
    factor_k = min(f_k + max_c delta_c s_kc,  max(f_k, m))          f_k = exp(-KL_k / T)

so every class ends at ``r_c >= rho`` (``CLASS_PROTECTION``, unless the cap binds) and a class KL
weighting does not starve is left alone. A sole holder gets ``rho * m``: ``rho`` times its
sample-weighting share (all of it at the default 1), since the aggregator renormalises
``n_k * factor_k``. ``m`` is taken at its fixed point (top-ups raise the mean, the mean raises the
top-ups; iterating from the plain mean rises monotonically to it).

Why the cap ``max(f_k, m)`` makes it robust to a lying agent: label counts are self-reported. A
liar may claim any class, but a top-up never lifts it above ``m``, the relative weight sample
weighting would give its (capped) sample count; it could already reach factor 1 by claiming the
federation's own distribution (KL 0). What a lie can do is dilute the honest holders' shares of
the class it claims (``S_c`` grows by the claim, bounded by its sample cap: ``LabelSkew.set_caps``
scales every histogram to it): their top-up then counts the fake mass, which is no worse than plain
``exp(-KL / T)``.

Pure numpy over chunks of stacked histograms (bounded memory); ``LabelSkew`` feeds them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

CLASS_PROTECTION = 1.0
"""Default ``protection``: no class weighs less than sample weighting gives it; 0 is plain KL weighting.

At 1 the fixed point lifts most skewed agents to the mean ``m`` and KL weighting keeps mainly its
other half, agents above the mean (balanced ones) weighing more. 0.75 kept more of KL's gain but
left the starved class at 48% where sample weighting reached 73% (bench/async.py, seed 3)."""

_FIXED_POINT_STEPS = 40
"""Most passes of ``protect``'s fixed point; each shrinks the gap by the lifted agents' sample share."""

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(samples [k], plain factors exp(-KL/T) [k], label counts [k, C]) of k labelled agents."""


@dataclass(frozen=True)
class Protection:
    """What admission needs per update, O(C): the mean factor, the top-up per unit share, the class totals."""

    mean: float
    top_up: np.ndarray
    """delta_c: class c's top-up per unit of share (0 for a class not starved)."""
    totals: np.ndarray

    def factors(self, kl_factors: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Protected factors of rows ``counts`` [k, C] whose plain factors are ``kl_factors`` [k]."""
        f = np.asarray(kl_factors, dtype=np.float64)
        lifted = f + (shares(counts, self.totals) * self.top_up).max(axis=1, initial=0.0)
        return np.minimum(lifted, np.maximum(f, self.mean))


def shares(counts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """``n_kc / S_c`` per row and class, in [0, 1]; 0 for a class whose total is 0."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.float64)
    if counts.ndim != 2 or totals.shape != counts.shape[1:]:
        raise ValueError(f"counts [agents, C] and totals [C] expected, got {counts.shape} and {totals.shape}")
    return np.clip(np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0), 0.0, 1.0)


def protect(chunks: Callable[[], Iterable[Chunk]], totals: np.ndarray, unlabelled_samples: float,
            protection: float = CLASS_PROTECTION) -> Protection:
    """The protection at the fixed point of ``m``; ``chunks`` is called once per pass over the agents.

    ``unlabelled_samples``: samples of agents without a histogram (factor 1, no class mass).
    """
    check_protection(protection)
    totals = np.asarray(totals, dtype=np.float64)
    kept = np.zeros(len(totals))  # sum_k f_k s_kc
    spread = np.zeros(len(totals))  # sum_k s_kc^2
    samples, weighted = float(unlabelled_samples), float(unlabelled_samples)
    for n, f, counts in chunks():
        s = shares(counts, totals)
        kept += np.asarray(f, dtype=np.float64) @ s
        spread += np.square(s).sum(axis=0)
        samples += float(np.sum(n))
        weighted += float(np.asarray(n, dtype=np.float64) @ np.asarray(f, dtype=np.float64))
    if samples <= 0:
        return Protection(1.0, np.zeros(len(totals)), totals)
    mean = weighted / samples

    def at(m: float) -> Protection:
        deficit = np.maximum(protection * m - kept, 0.0)
        return Protection(m, np.divide(deficit, spread, out=np.zeros_like(deficit), where=spread > 0), totals)

    current = at(mean)
    for _ in range(_FIXED_POINT_STEPS if protection > 0 else 0):
        total = float(unlabelled_samples) + sum(float(np.asarray(n, dtype=np.float64) @ current.factors(f, counts))
                                                for n, f, counts in chunks())
        following = min(total / samples, 1.0)
        if following - current.mean <= 1e-9:
            break
        current = at(following)
    return current


def class_weight_ratios(counts: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """Per class: its share of the factor-weighted label mass over its share of the plain label mass.

    ``(sum_k f_k n_kc / sum_k f_k n_k) / (S_c / N)``: 1 for every class under sample weighting; a class
    near 0 is one the weighting erases. NaN for a class no row holds (nothing to compare).
    """
    counts = np.asarray(counts, dtype=np.float64)
    weighted = np.asarray(factors, dtype=np.float64) @ counts if len(counts) else np.zeros(counts.shape[1])
    return mass_ratios(weighted, counts.sum(axis=0))


def mass_ratios(weighted: np.ndarray, plain: np.ndarray) -> np.ndarray:
    """``class_weight_ratios`` from the per-class masses: weighted ``sum_k f_k n_kc`` and plain ``S_c``."""
    weighted = np.asarray(weighted, dtype=np.float64)
    plain = np.asarray(plain, dtype=np.float64)
    plain_total, weighted_total = float(plain.sum()), float(weighted.sum())
    ratios = np.full(len(plain), np.nan)
    if plain_total <= 0 or weighted_total <= 0:
        return ratios
    held = plain > 0
    ratios[held] = (weighted[held] / weighted_total) / (plain[held] / plain_total)
    return ratios


def check_protection(protection: float) -> None:
    if not 0.0 <= protection <= 1.0:
        raise ValueError(f"protection must lie in [0, 1], got {protection}")
