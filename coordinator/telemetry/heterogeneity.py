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
* with ``--weighting kl``, the factor ``exp(-KL / T)`` by which its sample-count weight shrinks;
* a summary for the metrics: mean KL per device class, the label-skew index and the coefficient
  of variation of sample counts (see ``HeterogeneitySummary``).

Why ``exp(-KL / T)``: it is 1 for an agent whose labels match the federation's (plain FedAvg),
falls smoothly and monotonically as the agent's labels drift, never reaches 0 (a skewed agent
still contributes, it is not excluded) and needs no cut-off. ``exp(-n KL)`` is also how fast
the chance of drawing the agent's histogram from the federation's distribution vanishes with
``n`` samples (Sanov), so ``T`` reads as "how many nats of surprise cost one factor of e": at
``T = 1`` an agent at KL 1 counts e^-1 = 0.37 of its samples, one at KL 2 counts 0.14; ``T``
large approaches plain sample weighting. The aggregator renormalises the products
``n_k * exp(-KL_k / T)``, so only the factors' ratios matter.

Cost and memory: one histogram per known agent (the caller forgets agents that leave; the
coordinator's registry bounds how many there are). A status replaces the agent's histogram in
O(C): a running sum of counts is kept, the old histogram subtracted and the new one added (exact,
in int64: each agent's total is bounded by ``MAX_AGENT_SAMPLES``). ``kl`` and ``weight_factor``
are O(C) (``q`` and its logarithm are recomputed once after a change); ``summary`` is O(agents x C),
in chunks of bounded memory, meant to run once per round, not per status.

Pure numpy: no torch, no prometheus outside ``HeterogeneityMetrics``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, Gauge

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
    """int64 [C], read-only; None when it sent none (DP, regression, older agent)."""


@dataclass(frozen=True)
class HeterogeneitySummary:
    agents: int
    """Agents known (observed and not forgotten)."""
    labelled: int
    """Of them, agents with a histogram of at least one sample: the ones KL and skew are about."""
    kl_by_device: dict[str, float] = field(default_factory=dict)
    """Mean KL(agent || federation) per device class, over its labelled agents."""
    labelled_by_device: dict[str, int] = field(default_factory=dict)
    """Labelled agents per device class (the weights to fold device classes' means together)."""
    kl_max: float | None = None
    """Largest KL of any labelled agent (None: none)."""
    skew_index: float | None = None
    """Label-skew index: the mean over classes c of the population variance, across labelled agents,
    of their label proportions p_{a,c} = counts_{a,c} / n_a (unsmoothed). 0 when every agent has the
    same distribution; None without labelled agents."""
    sample_count_cv: float | None = None
    """Coefficient of variation of sample counts: population std / mean of ``num_samples`` over all
    known agents, labelled or not (None without agents or when every count is 0)."""


class LabelSkew:
    """Each known agent's latest label histogram, and the federation's label distribution.

    ``num_classes`` fixes the label space (the task card's); left None, the first histogram fixes
    it until every histogram is forgotten. A histogram of another length, or otherwise bad, raises
    ValueError and leaves everything as it was (the caller counts the rejection).
    """

    def __init__(self, num_classes: int | None = None, smoothing: float = SMOOTHING) -> None:
        if num_classes is not None and not 1 <= num_classes <= MAX_CLASSES:
            raise ValueError(f"num_classes must lie in [1, {MAX_CLASSES}], got {num_classes}")
        if not (smoothing > 0 and math.isfinite(smoothing)):
            raise ValueError(f"smoothing must be positive (it keeps KL finite), got {smoothing}")
        self._fixed_classes = num_classes
        self.smoothing = smoothing
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
        counts = None if label_counts is None else self._checked(agent_id, label_counts, num_samples)
        previous = self._agents.get(agent_id)
        if previous is not None and previous.counts is not None:
            self._remove_counts(previous.counts)
        if counts is not None:
            if self._total is None:
                self._total = np.zeros(len(counts), np.int64)
            self._total += counts
            self._with_counts += 1
            self._log_q = None
        self._agents[agent_id] = _Agent(device, int(num_samples), counts)

    def forget(self, agent_id: str) -> None:
        previous = self._agents.pop(agent_id, None)
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
        if agent is None or agent.counts is None or agent.num_samples == 0:
            return None
        return agent.counts / float(agent.num_samples)

    def kl(self, agent_id: str) -> float | None:
        """KL(p_agent || q_federation) in nats; None for an unknown agent or one without a histogram."""
        p = self.distribution(agent_id)
        log_q = self._federation_log()
        if p is None or log_q is None:
            return None
        return _kl_rows(p[None, :], log_q)[0]

    def weight_factor(self, agent_id: str, temperature: float) -> float:
        """exp(-KL / temperature) in (0, 1]; 1.0 for an agent without a histogram (under DP, or unknown)."""
        _check_temperature(temperature)
        kl = self.kl(agent_id)
        return 1.0 if kl is None else math.exp(-kl / temperature)

    def weight_factors(self, agent_ids: Iterable[str], temperature: float) -> dict[str, float]:
        return {agent_id: self.weight_factor(agent_id, temperature) for agent_id in agent_ids}

    # -- summary --------------------------------------------------------------------------
    def summary(self) -> HeterogeneitySummary:
        """KL per device class, the label-skew index and the CV of sample counts; O(agents x classes)."""
        samples = np.array([a.num_samples for a in self._agents.values()], dtype=np.float64)
        cv = None
        if len(samples) and samples.mean() > 0:
            cv = float(samples.std() / samples.mean())
        labelled = [a for a in self._agents.values() if a.counts is not None and a.num_samples > 0]
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
            p = np.stack([a.counts for a in chunk]).astype(np.float64)  # type: ignore[misc]
            p /= np.array([a.num_samples for a in chunk], dtype=np.float64)[:, None]
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


MAX_DEVICE_LABELS = 16
"""Distinct device-class label values the heterogeneity gauges take by default; later ones fold into ``other``."""


class HeterogeneityMetrics:
    """Prometheus gauges of the federation's label heterogeneity, on an injectable registry.

    * ``fl_label_kl_divergence{device}``: mean KL(agent || federation) of the device class's agents
      with a label histogram (a class with none has no series);
    * ``fl_label_skew_index``: mean over classes of the variance across agents of their label proportions;
    * ``fl_sample_count_cv``: std / mean of agents' training sample counts;
    * ``fl_weighting_factor_min``: the smallest current ``exp(-KL / T)`` factor; registered on the first
      ``update`` that gives a temperature, i.e. only when kl weighting is on.

    Device values come from agents, so they are bounded: ``device_label`` maps each to a label (pass
    ``CoordinatorMetrics.device_label`` to share its folding); by default the first
    ``MAX_DEVICE_LABELS`` distinct values keep their name and later ones fold into ``other``.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 device_label: Callable[[str], str] | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.kl = Gauge("fl_label_kl_divergence",
                        "Mean KL divergence (nats) of agents' label distributions to the federation's, by device class",
                        ["device"], registry=r)
        self.skew = Gauge("fl_label_skew_index",
                          "Label-skew index: mean over classes of the variance across agents of their label proportions",
                          registry=r)
        self.sample_cv = Gauge("fl_sample_count_cv",
                               "Coefficient of variation (std / mean) of agents' training sample counts", registry=r)
        self.factor_min: Gauge | None = None
        self._device_label = device_label or self._first_come_label
        self._devices: set[str] = set()
        self._exported: set[str] = set()

    def _first_come_label(self, device: str) -> str:
        if device in self._devices:
            return device
        if len(self._devices) < MAX_DEVICE_LABELS:
            self._devices.add(device)
            return device
        return "other"

    def update(self, skew: LabelSkew, temperature: float | None = None,
               summary: HeterogeneitySummary | None = None) -> HeterogeneitySummary:
        """Set every gauge from ``skew`` (or from its ``summary``, when the caller already computed it).

        ``temperature``: the kl weighting's, when it is on; None leaves ``fl_weighting_factor_min`` out.
        """
        summary = summary or skew.summary()
        self.update_from(summary, temperature)
        return summary

    def update_from(self, summary: HeterogeneitySummary, temperature: float | None = None) -> None:
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for device, mean in summary.kl_by_device.items():
            label = self._device_label(device)
            count = summary.labelled_by_device.get(device, 1)
            sums[label] = sums.get(label, 0.0) + mean * count
            counts[label] = counts.get(label, 0) + count
        for label in sums:
            self.kl.labels(label).set(sums[label] / counts[label])
        for stale in self._exported - sums.keys():  # a device class whose last labelled agent left
            self.kl.remove(stale)
        self._exported = set(sums)
        self.skew.set(_or_nan(summary.skew_index))
        self.sample_cv.set(_or_nan(summary.sample_count_cv))
        if temperature is not None:
            _check_temperature(temperature)
            if self.factor_min is None:
                self.factor_min = Gauge("fl_weighting_factor_min",
                                        "Smallest current kl-weighting factor exp(-KL / temperature) of any agent",
                                        registry=self.registry)
            self.factor_min.set(1.0 if summary.kl_max is None else math.exp(-summary.kl_max / temperature))


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value

