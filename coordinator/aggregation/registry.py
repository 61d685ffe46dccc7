"""The aggregation rules ``--aggregator`` can name, one registry entry each.

An entry's value is a :class:`Rule`: the rule function and, per keyword parameter, the
settings field it is read from; ``build_aggregator`` (aggregator.py) binds it to the settings.
Each entry declares its one-line summary, the settings it reads, and which ``updates`` it can
work from: ``individual`` (each update as sent) and, for a rule that is a weighted mean of its
inputs, ``summed`` (only their weighted sum: folded as they arrive, or a secure aggregate).
Every rule here streams over row blocks (stack.py), so none declares that.

Adding a rule: its function in a file of its own in this package, and one ``register_rule``
line below (plus any new parameter as a settings field). Third parties register an
``protocol.registry.Entry`` holding a :class:`Rule` under the entry-point group
``edgefl.aggregation_rules``; its parameters can only come from existing settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator.aggregation.coordinate import coordinate_median, trimmed_mean
from coordinator.aggregation.geometric_median import geometric_median
from coordinator.aggregation.krum import krum, multi_krum
from coordinator.aggregation.mean import weighted_mean
from protocol.registry import Entry, Registry

RuleFn = Callable[..., dict[str, np.ndarray]]
"""``rule(updates, weights, *, <its parameters>, clip_norm=None) -> {name: array}`` (see __init__.py)."""

UPDATES = "updates"
"""The aspect every entry declares: ``individual``, and ``summed`` if the weighted sum is enough."""


@dataclass(frozen=True)
class Rule:
    """What a registry entry holds: the rule function and where each of its parameters comes from."""

    fn: RuleFn
    params: tuple[tuple[str, str], ...] = ()
    """(keyword parameter of ``fn``, settings field), in the order ``Aggregator.describe`` lists them."""

    def bind(self, settings: Any) -> dict[str, Any]:
        """The rule's keyword arguments, read from ``settings`` (the coordinator settings)."""
        return {param: getattr(settings, field) for param, field in self.params}


RULES: Registry[Rule] = Registry("aggregation rule", "edgefl.aggregation_rules")


def register_rule(name: str, fn: RuleFn, summary: str, *, summed: bool = False, **params: str) -> Entry[Rule]:
    """Register ``fn`` as ``name``; ``params`` maps each keyword parameter to its settings field.

    ``summed``: the rule needs only the updates' weighted sum (the mean). Every rule also reads
    ``clip_norm``, applied by the Aggregator.
    """
    return RULES.register(name, Rule(fn, tuple(params.items())), summary=summary,
                          settings=(*params.values(), "clip_norm"),
                          updates=("individual", "summed") if summed else ("individual",))


def fewest_updates(rule: str, f: int, beta: float) -> int | None:
    """The fewest updates a round needs for ``rule`` to tolerate ``f`` Byzantine ones (1: no bound known); None when
    no number is enough (a trimmed mean that trims nothing cannot exclude anyone)."""
    if f == 0:
        return 1
    if rule in ("median", "geometric_median"):
        return 2 * f + 1
    if rule in ("krum", "multi_krum"):
        return 2 * f + 3
    if rule == "trimmed_mean":
        if beta <= 0:
            return None
        n = max(1, math.ceil(f / beta) - 1)
        while math.floor(beta * n) < f:  # floor(beta n) >= f, as the rule computes it in floating point
            n += 1
        return n
    return 1


def needs_individual_updates(entry: Entry[Rule]) -> bool:
    """Whether the rule must see each update (every robust rule): their sum alone will not do."""
    return not entry.supports(UPDATES, "summed")


register_rule("mean", weighted_mean, "the sample-weighted mean (FedAvg); updates are folded in as they arrive",
              summed=True)
register_rule("median", coordinate_median, "the coordinate-wise median; needs n > 2f", f="byzantine_f")
register_rule("trimmed_mean", trimmed_mean, "per coordinate, the mean without the floor(beta n) smallest and "
              "largest values; must trim at least f per end", beta="trim_beta", f="byzantine_f")
register_rule("krum", krum, "the update closest to its n - f - 2 nearest others; needs n > 2f + 2", f="byzantine_f")
register_rule("multi_krum", multi_krum, "the plain mean of the m best Krum-scored updates; needs n > 2f + 2",
              f="byzantine_f", m="multi_krum_m")
register_rule("geometric_median", geometric_median, "the geometric median (RFA, smoothed Weiszfeld) of whole "
              "updates; needs n > 2f", f="byzantine_f", iterations="geomed_iterations",
              smoothing="geomed_smoothing", tolerance="geomed_tolerance")
