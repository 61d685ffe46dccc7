"""Prometheus gauges of the federation's label heterogeneity and of KL weighting, and the summaries they show.

The numbers come from ``heterogeneity.LabelSkew``; this module imports nothing of it (it re-exports these).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge


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


@dataclass(frozen=True)
class WeightingSummary:
    """KL weighting at one temperature, over the known agents (``LabelSkew.weighting_summary``)."""

    factor_min: float
    """Smallest factor of any labelled agent, rare-class floor included (1.0: none labelled)."""
    class_ratio_min: float | None
    """Smallest, over held classes, of a class's share of the weighted label mass over its share
    under sample weighting: 1 means no class lost weight; near 0 flags a class the weighting erases."""
    class_ratio_argmin: int | None
    """The class at ``class_ratio_min``."""


class SkewSource(Protocol):
    """What the gauges read: ``heterogeneity.LabelSkew`` (named here by its methods: it imports this module)."""

    def summary(self) -> HeterogeneitySummary: ...

    def weighting_summary(self, temperature: float) -> WeightingSummary: ...


MAX_DEVICE_LABELS = 16
"""Distinct device-class label values the heterogeneity gauges take by default; later ones fold into ``other``."""


class HeterogeneityMetrics:
    """Prometheus gauges of the federation's label heterogeneity, on an injectable registry.

    * ``fl_label_kl_divergence{device}``: mean KL(agent || federation) of the device class's agents
      with a label histogram (a class with none has no series);
    * ``fl_label_skew_index``: mean over classes of the variance across agents of their label proportions;
    * ``fl_sample_count_cv``: std / mean of agents' training sample counts;
    * ``fl_weighting_factor_min``: the smallest current kl-weighting factor (rare-class floor included);
    * ``fl_weighting_class_ratio_min``: the smallest, over classes, of a class's share of the weighted
      label mass over its share under sample weighting (near 0: the weighting erases that class). Both
      registered on the first ``update`` that gives a temperature, i.e. only when kl weighting is on.

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
        self.class_ratio_min: Gauge | None = None
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

    def update(self, skew: SkewSource, temperature: float | None = None,
               summary: HeterogeneitySummary | None = None) -> HeterogeneitySummary:
        """Set every gauge from ``skew`` (or from its ``summary``, when the caller already computed it).

        ``temperature``: the kl weighting's, when it is on; None leaves ``fl_weighting_factor_min`` out.
        """
        summary = summary or skew.summary()
        self.update_from(summary, None if temperature is None else skew.weighting_summary(temperature))
        return summary

    def update_from(self, summary: HeterogeneitySummary, weighting: WeightingSummary | None = None) -> None:
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
        if weighting is not None:
            if self.factor_min is None or self.class_ratio_min is None:
                self.factor_min = Gauge("fl_weighting_factor_min",
                                        "Smallest current kl-weighting factor of any agent (rare-class floor included)",
                                        registry=self.registry)
                self.class_ratio_min = Gauge(
                    "fl_weighting_class_ratio_min", "Smallest, over classes, of a class's share of the kl-weighted "
                    "label mass over its share under sample weighting (near 0: a class is being erased)",
                    registry=self.registry)
            self.factor_min.set(weighting.factor_min)
            self.class_ratio_min.set(_or_nan(weighting.class_ratio_min))


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value

