"""Label heterogeneity of the federation: who trains on what, and how far each agent is from the rest.

Agents report ``AgentStatus.label_counts``, their training samples per class (never under DP: a
histogram of raw records is not covered by DP-SGD, so a DP agent leaves it out and is treated as
if it sat at the federation's distribution). ``LabelSkew`` keeps each agent's latest histogram
and derives:

* the federation's label distribution ``q``: the sum of every known agent's counts ``S``, with
  add-one (Laplace) smoothing, ``q_c = (S_c + 1) / (sum(S) + C)`` over ``C`` classes, so that
  every class has ``q_c > 0`` and the KL below is finite even for a class no agent holds;
* each agent's KL divergence to it, ``KL(p || q) = sum_c p_c ln(p_c / q_c)`` in nats, with
  ``p = counts / n`` unsmoothed (classes with ``p_c = 0`` contribute 0);
* with ``--weighting kl``, the factor ``exp(-KL / T)`` by which its sample-count weight shrinks,
  topped up so that no class weighs less than sample weighting gives it (``rare_classes``:
  the holders of a class KL weighting starves are lifted, at most to the mean factor);
* a summary for the metrics: mean KL per device class, the label-skew index and the coefficient
  of variation of sample counts (see ``HeterogeneitySummary``).

Why ``exp(-KL / T)``: it is 1 for an agent whose labels match the federation's (plain FedAvg),
falls smoothly and monotonically as the agent's labels drift, never reaches 0 (a skewed agent
still contributes, it is not excluded) and needs no cut-off. ``exp(-n KL)`` is also how fast
the chance of drawing the agent's histogram from the federation's distribution vanishes with
``n`` samples (Sanov), so ``T`` reads as "how many nats of surprise cost one factor of e": at
``T = 1`` an agent at KL 1 counts e^-1 = 0.37 of its samples, one at KL 2 counts 0.14; ``T``
large approaches plain sample weighting. The aggregator renormalises the products
``n_k * exp(-KL_k / T)``, so only the factors' ratios matter. Without the top-up it erased a class
on Dirichlet(0.1): two one-class agents held digit 2, and shrinking them shrank the class (issue 26).

Cost and memory: one histogram per known agent (the caller forgets agents that leave; the
coordinator's registry bounds how many there are). A status replaces the agent's histogram in
O(C): a running sum of counts is kept, the old histogram subtracted and the new one added (exact,
in int64: each agent's total is bounded by ``MAX_AGENT_SAMPLES``). ``kl`` and ``weight_factor``
are O(C) (``q``, its logarithm and the rare-class top-ups are recomputed once after a change of
counts: O(agents x C), and a status that repeats the agent's histogram changes nothing); ``summary``
and ``weighting_summary`` are O(agents x C), in chunks of bounded memory, meant to run once per round.

Pure numpy: no torch, no prometheus (the gauges, ``HeterogeneityMetrics``, are in ``heterogeneity_metrics``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from coordinator.telemetry.heterogeneity_metrics import (  # the gauges, and the summaries they show
    MAX_DEVICE_LABELS,
    HeterogeneityMetrics,
    HeterogeneitySummary,
    WeightingSummary,
)
from coordinator.telemetry.rare_classes import (
    CLASS_PROTECTION,
    Chunk,
    Protection,
    check_protection,
    mass_ratios,
    protect,
)
from protocol.messages import MAX_CLASSES, AgentStatus

SMOOTHING = 1.0
"""Pseudo-count added to every class of the federation's summed counts (add-one / Laplace)."""

MAX_AGENT_SAMPLES = 2**40
"""Most training samples one histogram may count: keeps the int64 running sum exact for 2**23 agents."""

_CHUNK_ELEMENTS = 1 << 22
"""Histograms stacked per step of ``summary`` (rows x classes): about 32 MiB of float64 at a time."""


@dataclass
class _Agent:
    device: str
    num_samples: int
    counts: np.ndarray | None
    """int64 [C], read-only, scaled down to the agent's sample cap (``LabelSkew.set_caps``); None when it sent none
    (DP, regression, older agent)."""
    raw: np.ndarray | None = None
    """The histogram as the status said, to rescale when the caps change."""
    claimed: int = 0
    """The status's num_samples; ``num_samples`` is it capped."""


class LabelSkew:
    """Each known agent's latest label histogram, and the federation's label distribution.

    ``num_classes`` fixes the label space (the task card's); left None, the first histogram fixes
    it until every histogram is forgotten. A histogram of another length, or otherwise bad, raises
    ValueError and leaves everything as it was (the caller counts the rejection).
    """

    def __init__(self, num_classes: int | None = None, smoothing: float = SMOOTHING,
                 protection: float = CLASS_PROTECTION) -> None:
        if num_classes is not None and not 1 <= num_classes <= MAX_CLASSES:
            raise ValueError(f"num_classes must lie in [1, {MAX_CLASSES}], got {num_classes}")
        if not (smoothing > 0 and math.isfinite(smoothing)):
            raise ValueError(f"smoothing must be positive (it keeps KL finite), got {smoothing}")
        check_protection(protection)
        self._fixed_classes = num_classes
        self.smoothing = smoothing
        self.protection = protection
        """Rare-class floor of the KL factor (``rare_classes``): 1 keeps a sole holder's weight, 0 is plain KL."""
        self._protections: dict[float, Protection] = {}
        """The rare-class top-ups per temperature, cleared on every change of counts or sample counts (once caps are
        set, at each ``set_caps`` only: a round's snapshot)."""
        self._cap_of: Callable[[str], int] | None = None
        """Each agent's sample cap (``set_caps``): a histogram counts for no more samples than its updates may."""
        self._agents: dict[str, _Agent] = {}
        self._total: np.ndarray | None = None if num_classes is None else np.zeros(num_classes, np.int64)
        """Running sum of every known histogram (int64 [C]); None until the label space is known."""
        self._with_counts = 0
        self._log_q: np.ndarray | None = None
        """ln q, recomputed lazily after a change (None: stale)."""

    # -- state ----------------------------------------------------------------------------
    @property
    def num_classes(self) -> int | None:
        return None if self._total is None else len(self._total)

    def __len__(self) -> int:
        return len(self._agents)

    def __contains__(self, agent_id: object) -> bool:
        return agent_id in self._agents

    def label_problem(self, status: AgentStatus) -> str | None:
        """Why the status's label counts cannot be recorded (another label space, a wrong sum), or None."""
        if status.label_counts is None:
            return None
        try:
            self._checked(status.agent_id, status.label_counts, status.num_samples)
        except ValueError as exc:
            return str(exc)
        return None

    def observe_status(self, status: AgentStatus) -> None:
        self.observe(status.agent_id, device=status.device, num_samples=status.num_samples,
                     label_counts=status.label_counts)

    def observe(self, agent_id: str, *, device: str, num_samples: int, label_counts: np.ndarray | None) -> None:
        """Record the agent's latest status; ``label_counts`` None drops a histogram it sent before."""
        if num_samples < 0:
            raise ValueError(f"{agent_id}: negative num_samples {num_samples}")
        raw = None if label_counts is None else self._checked(agent_id, label_counts, num_samples)
        previous = self._agents.get(agent_id)
        if previous is not None and previous.claimed == num_samples and (
                raw is None if previous.raw is None else raw is not None and np.array_equal(previous.raw, raw)):
            previous.device = device  # a repeated status: every cache stays valid
            return
        if self._cap_of is None:  # standalone: the top-ups follow every change; in a run, one snapshot a round
            self._protections.clear()
        if previous is not None and previous.counts is not None:
            self._remove_counts(previous.counts)
        self._agents[agent_id] = agent = self._capped(agent_id, device, int(num_samples), raw)
        if agent.counts is not None:
            if self._total is None:
                self._total = np.zeros(len(agent.counts), np.int64)
            self._total += agent.counts
            self._with_counts += 1
            self._log_q = None

    def set_caps(self, cap_of: Callable[[str], int]) -> None:
        """Each agent's histogram counts for at most ``cap_of(agent)`` samples, as its updates do: one device
        claiming a billion samples of one class in its status would otherwise be most of the federation's label
        distribution, push every honest agent's factor down and hide a class it does not hold. Called as a round
        opens (the claim cap follows the round's median claim); the rare-class top-ups are then taken afresh and
        kept for the round, so a status changing between updates cannot make every update recompute them."""
        self._cap_of = cap_of
        self._protections.clear()
        self._log_q = None
        total = None if self._total is None else np.zeros_like(self._total)
        for agent_id, agent in list(self._agents.items()):
            self._agents[agent_id] = agent = self._capped(agent_id, agent.device, agent.claimed, agent.raw)
            if agent.counts is not None and total is not None:
                total += agent.counts
        if total is not None:
            self._total = total

    def _capped(self, agent_id: str, device: str, claimed: int, raw: np.ndarray | None) -> _Agent:
        cap = self._cap_of(agent_id) if self._cap_of is not None else None
        if cap is None or claimed <= cap:
            return _Agent(device, claimed, raw, raw, claimed)
        counts = None
        if raw is not None:  # scaled down, floored: never more than the cap, proportions kept to a sample
            counts = (raw.astype(np.float64) * (cap / claimed)).astype(np.int64)
            counts.flags.writeable = False
        return _Agent(device, int(cap), counts, raw, claimed)

    def forget(self, agent_id: str) -> None:
        previous = self._agents.pop(agent_id, None)
        if previous is not None:
            self._protections.clear()
        if previous is not None and previous.counts is not None:
            self._remove_counts(previous.counts)

    def prune(self, known: Callable[[str], bool]) -> None:
        """Forget every agent ``known`` says the caller no longer holds (e.g. evicted from its registry)."""
        for agent_id in [a for a in self._agents if not known(a)]:
            self.forget(agent_id)

    def _remove_counts(self, counts: np.ndarray) -> None:
        assert self._total is not None
        self._total -= counts
        self._with_counts -= 1
        self._log_q = None
        if self._with_counts == 0 and self._fixed_classes is None:
            self._total = None  # the label space is free again

    def _checked(self, agent_id: str, label_counts: np.ndarray, num_samples: int) -> np.ndarray:
        counts = label_counts
        if not isinstance(counts, np.ndarray) or counts.ndim != 1 or counts.dtype.kind not in "iu":
            raise ValueError(f"{agent_id}: label counts must be a 1-D integer array")
        expected = self.num_classes
        # The agent's previous histogram alone may have fixed the label space: it is replaced, not compared.
        previous = self._agents.get(agent_id)
        if (expected is not None and self._fixed_classes is None and self._with_counts == 1
                and previous is not None and previous.counts is not None):
            expected = None
        if expected is not None and len(counts) != expected:
            raise ValueError(f"{agent_id}: label counts over {len(counts)} classes, the federation's have {expected}")
        if not 1 <= len(counts) <= MAX_CLASSES:
            raise ValueError(f"{agent_id}: label counts over {len(counts)} classes, expected 1 to {MAX_CLASSES}")
        if (counts < 0).any():
            raise ValueError(f"{agent_id}: negative label counts")
        if int(counts.max()) > MAX_AGENT_SAMPLES:
            raise ValueError(f"{agent_id}: label counts exceed {MAX_AGENT_SAMPLES} samples")
        total = int(counts.sum(dtype=np.int64))  # exact: at most MAX_CLASSES * 2**40 < 2**63
        if total > MAX_AGENT_SAMPLES:
            raise ValueError(f"{agent_id}: label counts exceed {MAX_AGENT_SAMPLES} samples")
        if total != num_samples:
            raise ValueError(f"{agent_id}: label counts sum to {total}, num_samples is {num_samples}")
        stored = counts.astype(np.int64, copy=True)
        stored.flags.writeable = False
        return stored

    # -- distributions --------------------------------------------------------------------
    def federation_counts(self) -> np.ndarray | None:
        """The running sum of every known histogram (a copy), None before the label space is known."""
        return None if self._total is None else self._total.copy()

    def federation_distribution(self) -> np.ndarray | None:
        """q: the smoothed, normalised sum of every known agent's counts; None without a label space."""
        if self._total is None:
            return None
        smoothed = self._total.astype(np.float64) + self.smoothing
        return smoothed / smoothed.sum()

    def _federation_log(self) -> np.ndarray | None:
        if self._log_q is None and self._total is not None:
            q = self.federation_distribution()
            assert q is not None
            self._log_q = np.log(q)
        return self._log_q

    def distribution(self, agent_id: str) -> np.ndarray | None:
        """The agent's label proportions, None without a histogram of at least one sample."""
        agent = self._agents.get(agent_id)
        if agent is None or agent.raw is None or agent.claimed == 0:
            return None
        return agent.raw / float(agent.claimed)  # proportions as reported: a cap scales counts, not their shape

    def kl(self, agent_id: str) -> float | None:
        """KL(p_agent || q_federation) in nats; None for an unknown agent or one without a histogram."""
        p = self.distribution(agent_id)
        log_q = self._federation_log()
        if p is None or log_q is None:
            return None
        return _kl_rows(p[None, :], log_q)[0]

    def weight_factor(self, agent_id: str, temperature: float) -> float:
        """exp(-KL / temperature), topped up where it starves a class the agent holds (``rare_classes``), in (0, 1];
        1.0 for an agent without a histogram (under DP, or unknown)."""
        _check_temperature(temperature)
        kl = self.kl(agent_id)
        if kl is None:
            return 1.0
        factor = math.exp(-kl / temperature)
        if self.protection == 0:
            return factor
        counts = self._agents[agent_id].counts
        assert counts is not None
        return float(self._protection(temperature).factors(np.array([factor]), counts[None, :])[0])

    def weight_factors(self, agent_ids: Iterable[str], temperature: float) -> dict[str, float]:
        return {agent_id: self.weight_factor(agent_id, temperature) for agent_id in agent_ids}

    def _protection(self, temperature: float) -> Protection:
        cached = self._protections.get(temperature)
        if cached is None:
            assert self._total is not None
            unlabelled = sum(a.num_samples for a in self._agents.values() if a.counts is None)
            cached = protect(lambda: self._chunks(temperature), self._total, unlabelled, self.protection)
            if len(self._protections) >= 8:  # one temperature per run; bound it all the same
                self._protections.clear()
            self._protections[temperature] = cached
        return cached

    def _chunks(self, temperature: float) -> Iterator[Chunk]:
        """(samples, exp(-KL / T), counts) of the labelled agents, in chunks of bounded memory."""
        labelled = [a for a in self._agents.values() if a.counts is not None and a.claimed > 0]
        log_q = self._federation_log()
        if not labelled or log_q is None:
            return
        rows = max(1, _CHUNK_ELEMENTS // len(log_q))
        for start in range(0, len(labelled), rows):
            part = labelled[start:start + rows]
            counts = np.stack([a.counts for a in part]).astype(np.float64)  # type: ignore[misc]
            samples = np.array([a.num_samples for a in part], dtype=np.float64)  # capped, as the counts
            p = np.stack([a.raw for a in part]).astype(np.float64)  # type: ignore[misc]
            p /= np.array([a.claimed for a in part], dtype=np.float64)[:, None]
            yield samples, np.exp(-_kl_rows(p, log_q) / temperature), counts

    def weighting_summary(self, temperature: float) -> WeightingSummary:
        """The smallest factor and the class losing most weight under KL weighting; O(agents x classes)."""
        _check_temperature(temperature)
        if self._total is None:
            return WeightingSummary(1.0, None, None)
        protection = self._protection(temperature)
        factor_min = 1.0
        weighted = np.zeros(len(self._total))
        for _, plain, counts in self._chunks(temperature):
            factors = protection.factors(plain, counts) if self.protection > 0 else plain
            factor_min = min(factor_min, float(factors.min()))
            weighted += factors @ counts
        ratios = mass_ratios(weighted, self._total)
        if np.isnan(ratios).all():
            return WeightingSummary(factor_min, None, None)
        worst = int(np.nanargmin(ratios))
        return WeightingSummary(factor_min, float(ratios[worst]), worst)

    # -- summary --------------------------------------------------------------------------
    def summary(self) -> HeterogeneitySummary:
        """KL per device class, the label-skew index and the CV of sample counts; O(agents x classes)."""
        samples = np.array([a.claimed for a in self._agents.values()], dtype=np.float64)
        cv = None
        if len(samples) and samples.mean() > 0:
            cv = float(samples.std() / samples.mean())
        labelled = [a for a in self._agents.values() if a.raw is not None and a.claimed > 0]
        log_q = self._federation_log()
        if not labelled or log_q is None:
            return HeterogeneitySummary(agents=len(self._agents), labelled=0, sample_count_cv=cv)
        classes = len(log_q)
        sum_p = np.zeros(classes)
        sum_p2 = np.zeros(classes)
        kl_sum: dict[str, float] = {}
        by_device: dict[str, int] = {}
        kl_max = 0.0
        rows = max(1, _CHUNK_ELEMENTS // classes)
        for start in range(0, len(labelled), rows):
            chunk = labelled[start:start + rows]
            p = np.stack([a.raw for a in chunk]).astype(np.float64)  # type: ignore[misc]
            p /= np.array([a.claimed for a in chunk], dtype=np.float64)[:, None]
            sum_p += p.sum(axis=0)
            sum_p2 += np.square(p).sum(axis=0)
            kls = _kl_rows(p, log_q)
            kl_max = max(kl_max, float(kls.max()))
            for agent, value in zip(chunk, kls, strict=True):
                kl_sum[agent.device] = kl_sum.get(agent.device, 0.0) + float(value)
                by_device[agent.device] = by_device.get(agent.device, 0) + 1
        n = len(labelled)
        variance = np.maximum(sum_p2 / n - np.square(sum_p / n), 0.0)
        return HeterogeneitySummary(
            agents=len(self._agents), labelled=n,
            kl_by_device={device: kl_sum[device] / count for device, count in by_device.items()},
            labelled_by_device=by_device, kl_max=kl_max, skew_index=float(variance.mean()), sample_count_cv=cv,
        )


def _kl_rows(p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """KL(p_i || q) for each row p_i of ``p`` (rows sum to 1); 0 ln 0 = 0."""
    log_p = np.log(p, out=np.zeros_like(p), where=p > 0)
    terms = np.where(p > 0, p * (log_p - log_q), 0.0)
    return np.maximum(terms.sum(axis=1), 0.0)  # >= 0 in exact arithmetic; rounding may dip below


def _check_temperature(temperature: float) -> None:
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")


__all__ = ["MAX_AGENT_SAMPLES", "MAX_DEVICE_LABELS", "HeterogeneityMetrics", "HeterogeneitySummary", "LabelSkew",
           "WeightingSummary"]
