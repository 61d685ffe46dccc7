"""One round at a site: its agents' accepted updates folded per family, their outcomes, and the partials they make.

Deltas fold into a float64 ``RunningMean`` per family (the root's own accumulator, with the same
``clip_norm``), after the root's norm gate (clipped against the median norm of the site's deltas of
the family this round). Under a robust rule (``aggregator`` median, trimmed_mean, krum, ...) the site
keeps its accepted deltas instead and applies the rule to them at the close; its partial then carries
the rule's result times the number of agents it counted, and that number as its weight (each counted
agent weighs 1: robust rules ignore claimed sample counts, which a Byzantine agent could inflate), so
the root's mean across sites is the agent-weighted mean of the sites' robust results. SCAFFOLD's control
deltas go the same way beside the deltas (``controls``; clipped against the median of their own norms, as at
the root; under a rule, the rule over them too) and up as ``control_sums``. FedProto's prototypes are kept
(``prototypes``: small, ``[classes, dim]``) and go up as per-class sums of count x prototype with the counts
(under a rule, the rule's per-class result x the count). A site with too
few updates for its rule (``byzantine_f``) counts none of them (``site_too_few``), rather than averaging
a possible attacker in. Bootstrap proposals are grouped by digest, and the one a strict majority of
the site's proposers sent alike goes up, as the root would have agreed on it. At the close every
agent of the site the round selected has an outcome: accepted, rejected (with its reason) or straggler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from coordinator.aggregation import AggregationError
from coordinator.aggregation.aggregator import Aggregator
from coordinator.aggregation.running_mean import Layout, RunningMean, l2_norm, layout_key
from coordinator.reasons import RejectReason
from coordinator.round.norm_clip import NormGate, RoundNorms, clip_factor, control_key, held_size, scaled
from coordinator.sites.secure import SiteSecureRound
from coordinator.state.rounds import OpenRound
from coordinator.strategies.fedproto import capped_counts, group_sums
from protocol.digest import digest_arrays
from protocol.messages import Update
from protocol.partials import AgentOutcome, PartialAggregate


@dataclass
class SiteRound:
    open: OpenRound
    """The root's announcement, with the site's own deadline; ``updates`` holds who answered (admission reads it)."""
    clip_norm: float | None
    norm_gate: NormGate[tuple[Update, float]]
    means: dict[str, RunningMean] = field(default_factory=dict)
    controls: dict[str, RunningMean] = field(default_factory=dict)
    """SCAFFOLD: family -> the control deltas' running mean, folded with the same shares as ``means``."""
    proposals: dict[str, dict[str, tuple[Update, list[str]]]] = field(default_factory=dict)
    """family -> proposal digest -> (the first update that sent it, the agents that sent it)."""
    outcomes: dict[str, AgentOutcome] = field(default_factory=dict)
    bytes_in: int = 0
    rule: Aggregator | None = None
    """A robust rule applied at the close to ``kept``; None: deltas fold into ``means`` as they come."""
    rule_failure: str | None = None
    """Why the rule could not run at the close (too few updates for ``byzantine_f``), for the log."""
    layouts: dict[str, tuple[Layout, Layout]] = field(default_factory=dict)
    """family -> the (delta, control delta) layouts of its first folded update: the others must match (``_fold``)."""
    kept: dict[str, list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]]] = field(default_factory=dict)
    """Under ``rule``: family -> (agent, its delta and control delta after the norm gate), for the close."""
    prototypes: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = field(default_factory=dict)
    """FedProto: family -> (agent, its prototypes, its counts scaled to the samples it was counted for)."""
    secure: SiteSecureRound | None = None
    """The round's secure sessions of this site's agents (``secure.py``), when the announcement gives it some."""

    @classmethod
    def start(cls, open_round: OpenRound, clip_norm: float | None, max_norm_ratio: float,
              rule: Aggregator | None = None, cohorts: Mapping[str, int] | None = None,
              hold_bytes: int = 0, others: int = 0) -> SiteRound:
        """``cohorts``: per family, the site's agents the round selected (the gate holds their deltas until all
        came, within ``hold_bytes``; ``others``: selected agents of no family known here: ``norm_clip.py``)."""
        return cls(open_round, clip_norm, NormGate(RoundNorms(max_norm_ratio), cohorts or {}, hold_bytes, others),
                   rule=rule)

    def accept(self, update: Update, samples: int, weight: float, norm: float | None) -> None:
        """An update admission accepted, counted for ``samples`` at ``weight`` (the policy's factor)."""
        share = float(samples) * weight if update.task == "train" else 0.0
        if update.control_delta and self.open.announcement.algorithm != "scaffold":
            update = update.model_copy(update={"control_delta": {}})  # no other algorithm uses one (nor the root)
        if self.rule is not None and share > 0:
            share = 1.0  # counted agents weigh alike under a robust rule (claims are the agents' word)
        m = update.metrics
        self.outcomes[update.agent_id] = AgentOutcome(
            outcome="accepted", samples=samples, weight=share, eval_accuracy=m.eval_accuracy, eval_loss=m.eval_loss,
            num_eval_samples=m.num_eval_samples)
        self.open.updates[update.agent_id] = update.model_copy(update={"delta": {}, "weights": {}, "control_delta": {}})
        if self.open.announcement.algorithm == "fedproto":  # prototypes only: weights or a delta sent beside are not
            if share > 0 and update.prototypes is not None and update.prototype_counts is not None:  # read (as root)
                counts = capped_counts(update.prototype_counts, samples, update.num_samples)  # as the root scales
                self.prototypes.setdefault(update.family, []).append((update.agent_id, update.prototypes, counts))
        elif update.weights:  # SCAFFOLD's proposers agree on their control delta too, as at the root
            digest = digest_arrays([("weights", update.weights), ("control_delta", update.control_delta)])
            votes = self.proposals.setdefault(update.family, {})
            votes.setdefault(digest, (update, []))[1].append(update.agent_id)
        elif update.delta:
            if update.control_delta and norm is not None:
                self.norm_gate.norms.observe(control_key(update.family), l2_norm(update.control_delta))
            if norm is None:
                self._fold(update, share, None)
                return
            for (held, held_share), bound in self.norm_gate.admit(update.family, (update, share), norm,
                                                                      held_size(update)):
                self._fold(held, held_share, bound)

    def reject(self, agent_id: str, reason: str) -> None:
        """Recorded for an agent of the round that has no outcome yet (a resent copy does not undo an acceptance)."""
        if agent_id not in self.outcomes:
            self.outcomes[agent_id] = AgentOutcome(outcome="rejected", reason=reason)

    def _fold(self, update: Update, share: float, bound: float | None) -> None:
        delta, control = update.delta, update.control_delta
        layouts = (layout_key(delta), layout_key(control))
        if self.layouts.setdefault(update.family, layouts) != layouts:  # admission checked both against the round's
            self.outcomes[update.agent_id] = AgentOutcome(outcome="rejected", reason=RejectReason.BAD_SHAPE.value)
            return  # announcement: unreachable unless that changes, and then one agent must not fail the site's sums
        factor = control_factor = 1.0
        if bound is not None:
            factor = clip_factor(l2_norm(delta), bound)
            control_factor = clip_factor(l2_norm(control), self.norm_gate.norms.bound(control_key(update.family)))
        if self.rule is not None:
            if share > 0:
                self.kept.setdefault(update.family, []).append((update.agent_id, scaled(delta, factor),
                                                                scaled(control, control_factor)))
            return
        # The mean folds the clip's factor in, as at the root (no scaled copy).
        self.means.setdefault(update.family, RunningMean(self.clip_norm)).add(delta, share, update.agent_id, factor)
        if control:  # unclipped by clip_norm, which bounds model deltas (as at the root: FOLD_RULES)
            self.controls.setdefault(update.family, RunningMean(None)).add(control, share, update.agent_id,
                                                                         control_factor)

    def _robust(self, family: str, outcomes: dict[str, AgentOutcome]) -> dict:
        """The rule over the family's kept deltas, as partial fields (sums = count x result); on too few updates,
        nothing, and the agents it would have counted are rejected (``outcomes`` changed in place)."""
        assert self.rule is not None
        kept = sorted(self.kept.get(family, []), key=lambda item: item[0])
        if not kept:
            return {}
        controls = [control for _, _, control in kept]
        try:
            result = self.rule([delta for _, delta, _ in kept], [1.0] * len(kept))
            control = self.rule.unclipped(controls, [1.0] * len(kept)) if all(controls) else {}  # as at the root
        except AggregationError as exc:
            for agent_id, _, _ in kept:
                outcomes[agent_id] = AgentOutcome(outcome="rejected", reason=RejectReason.SITE_TOO_FEW.value)
            self.rule_failure = f"{family}: {exc}"
            return {}
        n = float(len(kept))
        return {"sums": {k: n * v.astype("<f8") for k, v in result.items() if v.dtype.kind == "f"},
                "integers": {k: v for k, v in result.items() if v.dtype.kind != "f"}, "heaviest": kept[0][0],
                "control_sums": {k: n * v.astype("<f8") for k, v in control.items()}}

    def partials(self, run_id: str, site_id: str, families: dict[str, str]) -> list[PartialAggregate]:
        """The close: one partial per family of the site's selected agents (``families``: agent -> family)."""
        for (held, share), bound in self.norm_gate.release():
            self._fold(held, share, bound)
        announcement = self.open.announcement
        by_family: dict[str, dict[str, AgentOutcome]] = {}
        for agent_id, family in families.items():
            outcome = self.outcomes.get(agent_id) or AgentOutcome(outcome="straggler")
            by_family.setdefault(family, {})[agent_id] = outcome
        out = []
        for family, outcomes in sorted(by_family.items()):
            ref = announcement.states.get(family)
            fields: dict = {"base_digest": ref.digest if ref is not None else None}
            if ref is None and announcement.task == "train":
                agreed = self._agreed(family, outcomes)
                if agreed is not None:
                    fields.update(proposal=dict(agreed.weights), proposal_control=dict(agreed.control_delta))
            mean = self.means.get(family)
            if family in self.prototypes:
                fields.update(self._prototype_sums(family, outcomes))
            elif ref is not None and self.rule is not None:
                fields.update(self._robust(family, outcomes))
            elif ref is not None and mean is not None and mean.count:
                assert mean.heaviest is not None
                fields.update(sums=dict(mean.sums), integers=dict(mean.others), heaviest=mean.heaviest[1])
                control = self.controls.get(family)
                if control is not None:
                    fields["control_sums"] = dict(control.sums)
            accepted = [o for o in outcomes.values() if o.outcome == "accepted"]
            out.append(PartialAggregate(
                run_id=run_id, epoch=announcement.epoch, site_id=site_id, round=announcement.round, family=family,
                total_weight=sum(o.weight for o in accepted), count=sum(1 for o in accepted if o.weight > 0),
                outcomes=outcomes, bytes_in=self.bytes_in, **fields))
        return out

    def _prototype_sums(self, family: str, outcomes: dict[str, AgentOutcome]) -> dict:
        """FedProto's partial fields: per class, the sum of count x prototype over the family's agents, exact in
        float64 for the mean; under a robust rule the rule's per-class result x the class's count. On too few
        holders of a class for the rule, nothing, and the agents it would have counted are rejected (``outcomes``
        changed in place), as ``_robust`` does with deltas."""
        kept = sorted(self.prototypes[family], key=lambda item: item[0])
        prototypes, counts = [p for _, p, _ in kept], [c for _, _, c in kept]
        try:
            sums, totals = group_sums(self.rule.unclipped if self.rule is not None else None, prototypes, counts)
        except AggregationError as exc:
            for agent_id, _, _ in kept:
                outcomes[agent_id] = AgentOutcome(outcome="rejected", reason=RejectReason.SITE_TOO_FEW.value)
            self.rule_failure = f"{family}: {exc}"
            return {}
        return {"prototype_sums": sums, "prototype_counts": totals.astype("<i8")}

    def _agreed(self, family: str, outcomes: dict[str, AgentOutcome]) -> Update | None:
        """An update of the proposal a strict majority of the site's proposers of ``family`` sent; the others are
        rejected (``outcomes`` changed in place); None when no proposal has a majority."""
        votes = self.proposals.get(family, {})
        voters = sum(len(agents) for _, agents in votes.values())
        best = max(votes.values(), key=lambda v: len(v[1]), default=None)
        agreed = best is not None and 2 * len(best[1]) > voters
        for proposer, agents in votes.values():
            if agreed and proposer is best[0]:  # type: ignore[index]
                continue
            for agent_id in agents:
                outcomes[agent_id] = AgentOutcome(outcome="rejected", reason=RejectReason.BOOTSTRAP_DISAGREES.value)
        return best[0] if agreed and best is not None else None
