"""What every strategy provides: round parameters, update checks, aggregation, state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from coordinator.admission.decisions import Reject
from coordinator.aggregation import AggregationError, FailureReason
from coordinator.aggregation.aggregator import AggregateFn, Aggregator
from coordinator.aggregation.running_mean import RunningMean
from coordinator.reasons import RejectReason
from coordinator.settings import MEDIAN_OF
from coordinator.strategies.accumulators import FOLD_RULES, RoundFolds, RoundRows
from coordinator.strategies.bootstrap import agree_by_votes, proposal_digest
from protocol.arrays import all_finite, check_layout, layout_of
from protocol.compression import half_precision
from protocol.errors import ProtocolError
from protocol.messages import Algorithm, GlobalState, Update

StatePrecision = Literal["float32", "float16"]


@dataclass
class FamilyState:
    """The global state one model family starts round ``round`` from.

    ``weights`` is the coordinator's master copy; agents receive ``published_weights``, float16
    when ``published_as`` says so (half the bytes), and ``digest`` is that of what they receive:
    the base an update names. An agent's delta is taken from the rounded weights it loaded and
    added to the master copy, so the rounding error never accumulates across rounds.
    """

    round: int
    weights: dict[str, np.ndarray]
    control: dict[str, np.ndarray] = field(default_factory=dict)
    prototypes: np.ndarray | None = None
    prototype_counts: np.ndarray | None = None
    published_as: StatePrecision = "float32"
    digest: str = field(default="", init=False)
    published_weights: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        # Every input was finite, but sums of them need not be (float32 overflows past 3.4e38):
        # a state that could not be published must fail its round, not the coordinator.
        parts = {**{f"weights.{k}": v for k, v in self.weights.items()},
                 **{f"control.{k}": v for k, v in self.control.items()}, "prototypes": self.prototypes}
        for name, array in parts.items():
            if array is not None and array.dtype.kind == "f" and not all_finite(array):
                raise AggregationError(FailureReason.NON_FINITE_RESULT, f"round {self.round} state: {name} is not finite")
        self.published_weights = half_precision(self.weights) if self.published_as == "float16" else self.weights
        self.digest = GlobalState.compute_digest(self.published_weights, self.control, self.prototypes,
                                                 self.prototype_counts)

    def message(self, run_id: str, family: str, epoch: int = 0) -> GlobalState:
        # Checked and digested in __post_init__: validating again would hash the whole model twice.
        return GlobalState.model_construct(
            run_id=run_id, family=family, round=self.round, digest=self.digest, weights=self.published_weights,
            control=self.control, prototypes=self.prototypes, prototype_counts=self.prototype_counts, epoch=epoch,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round, "weights": self.weights, "control": self.control,
            "prototypes": self.prototypes, "prototype_counts": self.prototype_counts,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], published_as: StatePrecision = "float32") -> FamilyState:
        return cls(
            round=int(data["round"]), published_as=published_as,
            weights={k: np.array(v) for k, v in data["weights"].items()},
            control={k: np.array(v) for k, v in data["control"].items()},
            prototypes=None if data["prototypes"] is None else np.array(data["prototypes"]),
            prototype_counts=None if data["prototype_counts"] is None else np.array(data["prototype_counts"]),
        )


class Strategy(ABC):
    """Decides what a round asks for and how the updates become the next global states.

    ``states`` holds one :class:`FamilyState` per model family. A family without one yet
    bootstraps: its agents start from the announced seeded initialisation and send weights.

    Every combination of agents' payloads goes through ``self.aggregator``, so any strategy
    runs with any configured rule (mean, median, trimmed mean, Krum, Multi-Krum):
    ``self.aggregator(deltas, weights)`` for updates (clipped when clipping is configured),
    ``self.aggregator.unclipped(values, weights)`` for absolute values such as
    prototypes. A bootstrap's first state is combined by no rule: see ``first_state``. A rule may raise ``AggregationError``; ``aggregate`` must then
    leave ``states`` untouched (compute every family first, commit at the end), and the
    engine fails the round with the error's reason.
    """

    algorithm: ClassVar[Algorithm]
    folds_payloads: ClassVar[bool] = True
    """Whether payloads may be folded into running means on receipt (see ``begin_round``)."""
    bootstrap_fields: ClassVar[tuple[str, ...]] = ("weights",)
    """What a bootstrap proposal is: the fields its agents must send byte for byte alike (see ``first_state``)."""

    def __init__(self, aggregator: Aggregator | AggregateFn, publish_states_as: StatePrecision = "float32") -> None:
        self.aggregator = Aggregator.of(aggregator)
        self.publish_states_as = publish_states_as
        self.states: dict[str, FamilyState] = {}
        self.folds: RoundFolds | None = None
        self.rows: RoundRows | None = None
        self.proposals: RoundRows | None = None
        """Under the mean: bootstrap proposals (absolute weights), kept whole as rows (see ``first_state``)."""
        self._proposed: set[str] = set()
        self._proposal_digests: dict[str, str] = {}
        """Agent -> its bootstrap proposal's digest, taken once as it arrives."""
        self._first_proposals: dict[tuple[str, str], Update] = {}
        """(family, digest) -> the first proposal kept with it: the others alike share its rows."""
        self.weights: dict[str, float] = {}
        """This round's weight multiplier per agent (1 unless a policy or the weighting set one)."""
        self.voters: dict[str, set[str]] = {}
        """Per family, its agents this round selected: a first state needs a strict majority of at least
        ``MEDIAN_OF`` of them (``first_state``), and a vote carried over counts while its agent is among them."""
        self._votes: dict[str, dict[str, str]] = {}
        """Per family without a state, each proposing agent's latest proposal digest ("": a minority layout)."""

    # -- one round's payloads ------------------------------------------------------------
    def begin_round(self, capacity: int, *, memory_budget_bytes: int = 512 * 1024**2,
                    spill_dir: Path | None = None, voters: Mapping[str, Collection[str]] | None = None) -> None:
        """A round of at most ``capacity`` updates opens. Under the plain weighted mean each accepted
        payload is folded in as it arrives; under a robust rule it is copied into row matrices (on
        disk in ``spill_dir`` past the memory budget). ``voters``: per family, its agents the round
        selected (``first_state``)."""
        self.end_round()
        self.weights = {}
        self.voters = {family: set(agents) for family, agents in (voters or {}).items()}
        if not self.folds_payloads:
            return
        if not self.aggregator.needs_individual_updates:  # the mean: its running sum is enough
            self.folds = RoundFolds(self.aggregator.clip_norm)
            self.proposals = RoundRows(capacity, memory_budget_bytes, spill_dir)
        else:
            self.rows = RoundRows(capacity, memory_budget_bytes, spill_dir)

    @property
    def folding(self) -> bool:
        """This round folds payloads into running means as they come (``accumulate`` then takes ``factors``)."""
        return self.folds is not None

    def accumulate(self, update: Update, weight: float = 1.0, factors: Mapping[str, float] | None = None) -> Update:
        """Take in an accepted update; returns what the round must keep of it (its arrays folded or stored).

        ``weight`` multiplies its sample count in every by-samples mean (staleness, label skew). ``factors``:
        payload field -> the scale its arrays count with (the norm gate's clip), applied in the fold instead of
        a scaled copy; only a round that is ``folding`` takes them (the others store scaled copies)."""
        self.weights[update.agent_id] = weight
        scaled = factors is not None and any(f != 1.0 for f in factors.values())
        if scaled and (self.folds is None or update.weights):
            raise ValueError("scale factors are applied in a fold: store a scaled copy instead")
        if self.proposals is not None and update.weights:  # a family's first state: see first_state
            self._proposed.add(update.agent_id)
            return self._keep_proposal(self.proposals, update)
        if self.folds is not None:
            return self.folds.add(update, weight, factors if scaled else None)
        if self.rows is not None:
            return self.rows.add(update)
        return update

    def _keep_proposal(self, proposals: RoundRows, update: Update) -> Update:
        """Honest proposals are byte-identical, so one copy of each distinct proposal is stored and the
        others share it (10,000 agents proposing one 127k-parameter model held 5 GB of rows)."""
        digest = proposal_digest(update, self.bootstrap_fields)
        self._proposal_digests[update.agent_id] = digest
        stored = [name for name in FOLD_RULES if getattr(update, name)]
        first = self._first_proposals.get((update.family, digest))
        if first is not None and set(stored) <= set(self.bootstrap_fields):  # the digest covers all it carries
            return update.model_copy(update={name: getattr(first, name) for name in stored})
        kept = proposals.add(update)
        self._first_proposals.setdefault((update.family, digest), kept)
        return kept

    def accumulate_sums(self, family: str, mean: RunningMean | Mapping[str, RunningMean], members: set[str]) -> bool:
        """Take in payloads folded elsewhere for ``members``: a site's partial aggregate (its deltas' mean), or
        a secure round's unmasked sums (payload field -> mean: ``delta``, and ``control_delta`` under SCAFFOLD).
        False when this round does not fold payloads into means (a robust rule, FedProto), which then cannot
        use them."""
        if self.folds is None:
            return False
        self.folds.add_folded(family, {"delta": mean} if isinstance(mean, RunningMean) else mean, members)
        return True

    def accumulate_prototype_sums(self, family: str, sums: np.ndarray, counts: np.ndarray, members: set[str]) -> bool:
        """Take in a secure FedProto round's unmasked per-class sums of count-weighted prototypes and per-class
        counts for ``members`` (``protocol.secagg.prototype_vector``). False for a strategy without prototypes."""
        return False

    def accumulate_site_prototypes(self, sums: np.ndarray, counts: np.ndarray) -> bool:
        """Take in a site's FedProto partial: per class, the sum of count x prototype and the count over its agents.
        False for a strategy without prototypes, or sums not shaped as the global prototypes."""
        return False

    def end_round(self) -> None:
        """Let the round's folded sums and stored rows go (a spill file is deleted)."""
        for rows in (self.rows, self.proposals):
            if rows is not None:
                rows.close()
        self.folds = self.rows = self.proposals = None
        self._proposed = set()
        self._proposal_digests = {}
        self._first_proposals = {}

    def combine(self, group: Sequence[Update], payload: str) -> dict[str, np.ndarray]:
        """The configured rule over field ``payload`` of ``group``, weighted and clipped as FOLD_RULES says."""
        values = [getattr(u, payload) for u in group]
        if self.folds is not None and not all(u.agent_id in self._proposed for u in group):
            return self.folds.mean(group, payload)
        rule = FOLD_RULES[payload]
        weights = [self.sample_weight(u) if rule.by_samples else 1.0 for u in group]
        return self.aggregator(values, weights) if rule.clipped else self.aggregator.unclipped(values, weights)

    def sample_weight(self, update: Update) -> float:
        return float(update.num_samples) * self.weights.get(update.agent_id, 1.0)

    def first_state(self, family: str, group: Sequence[Update]) -> tuple[list[Update], list[Dropped]]:
        """The bootstrap proposals of ``family`` that a strict majority of its proposing agents sent alike
        (empty: none had one, the family stays without state), and the others, dropped.

        No rule combines them: the state is the agreed proposal exactly (``bootstrap.py``), so one
        device's weights, however large, never reach it. A minority layout is ``bad_shape`` as before;
        its agents still count among those a majority is of."""
        proposers = {u.agent_id for u in group}
        dropped: list[Dropped] = []
        for name in self.bootstrap_fields:
            group, left_out = self.majority_layout(group, name)
            dropped += left_out
        digests = self._proposal_digests
        # Votes carry over the family's bootstrap rounds until one proposal has its majority, of at least MEDIAN_OF of
        # its selected agents: under FedBuff a buffer mixes families, so a family's proposals may come one to a
        # buffer, and one agent alone among them would otherwise be a strict majority of one.
        votes = self._votes.setdefault(family, {})
        selected = self.voters.get(family, set())
        for agent in [a for a in votes if a not in selected]:  # left the family, went away or was not selected again:
            del votes[agent]  # its old vote must not hold a majority back
        votes.update(dict.fromkeys(proposers, ""))  # a minority layout still counts among those a majority is of
        for update in group:
            votes[update.agent_id] = digests.get(update.agent_id) or proposal_digest(update, self.bootstrap_fields)
        agreement = agree_by_votes(family, group, votes, min(len(selected), MEDIAN_OF))
        if agreement.kept:
            del self._votes[family]
        return agreement.kept, dropped + [Dropped(*rejected) for rejected in agreement.rejected]

    def majority_layout(self, updates: Sequence[Update], payload: str) -> tuple[list[Update], list[Dropped]]:
        """:func:`majority_by` the layout of field ``payload`` (as folded, when it was)."""
        def key(update: Update) -> Hashable:
            folded = self.folds.layout(update, payload) if self.folds is not None else None
            return folded if folded is not None else tuple(
                sorted((n, s, d) for n, (s, d) in layout_of(getattr(update, payload)).items()))

        return majority_by(updates, key, payload)

    def round_params(self, round_number: int) -> dict[str, float | int | bool]:
        """Algorithm hyper-parameters announced with the round."""
        return {}

    def check_update(self, update: Update) -> Reject | None:
        """Why ``update`` does not carry what this round asked of its family, or None."""
        state = self.states.get(update.family)
        if state is None:
            return self._check_bootstrap(update)
        return check_base(update, state) or self.check_delta(update)

    def check_delta(self, update: Update) -> Reject | None:
        """The delta's layout against the family's current state, whatever version it started from
        (asynchronous rounds check a stale update's base against that version instead)."""
        state = self.states.get(update.family)
        if state is None:
            return self._check_bootstrap(update)
        if not update.delta:
            return Reject(RejectReason.MISSING_PAYLOAD, "a training update must carry a delta")
        return layout_problem(update.delta, state.weights, "delta")

    def _check_bootstrap(self, update: Update) -> Reject | None:
        if not update.weights:
            return Reject(RejectReason.MISSING_PAYLOAD, f"family {update.family} bootstraps: send weights")
        return None

    @abstractmethod
    def aggregate(self, round_number: int, updates: Sequence[Update],
                  population: Mapping[str, int] | None = None) -> list[Dropped]:
        """Turn one round's accepted updates into ``states`` for round ``round_number + 1``.

        ``population`` is the number of agents of each family known to the coordinator (online
        or not), for strategies that scale by it (SCAFFOLD's 1/N). Returns the updates it had to
        leave out, and why. Raises AggregationError when the round cannot be aggregated.
        """

    def state_dict(self) -> dict[str, Any]:
        # Bootstrap votes too: a restart must not start a family's vote over (colluders answering after it would
        # outvote honest agents slow to answer again).
        return {"families": {f: s.to_dict() for f, s in self.states.items()},
                "votes": {f: dict(votes) for f, votes in self._votes.items() if f not in self.states}}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        self.states = {f: FamilyState.from_dict(s, self.publish_states_as) for f, s in data["families"].items()}
        votes = data.get("votes") or {}  # since 2026-12-04
        if not (isinstance(votes, dict) and all(isinstance(f, str) and isinstance(v, dict) for f, v in votes.items())
                and all(isinstance(a, str) and isinstance(d, str) and (d == "" or _is_digest(d))
                        for v in votes.values() for a, d in v.items())):
            raise ValueError("the strategy's bootstrap votes must map families to {agent: proposal digest}")
        self._votes = {f: dict(v) for f, v in votes.items() if f not in self.states}

    def new_state(self, round_number: int, weights: dict[str, np.ndarray],
                  control: dict[str, np.ndarray] | None = None) -> FamilyState:
        """A family's next global state, published as this run publishes states."""
        return FamilyState(round=round_number, weights=weights, control=control or {},
                           published_as=self.publish_states_as)


def _is_digest(text: str) -> bool:
    """A proposal digest as ``protocol.digest`` writes it: lowercase hex."""
    return 0 < len(text) <= 128 and all(c in "0123456789abcdef" for c in text)


@dataclass(frozen=True)
class Dropped:
    agent_id: str
    reason: RejectReason
    detail: str


def majority_by(updates: Sequence[Update], key: Callable[[Update], Hashable],
                what: str) -> tuple[list[Update], list[Dropped]]:
    """Keep the updates whose ``key`` (a payload's layout) is the most common one.

    Bootstrap rounds have no global state to check shapes against, so one broken or hostile
    agent must not define the model: the layout sent by most agents (then by most samples,
    then the first) wins, and the others are dropped.
    """
    groups: dict[Hashable, list[Update]] = {}
    for update in updates:
        groups.setdefault(key(update), []).append(update)
    best = max(groups.values(), key=lambda g: (len(g), sum(u.num_samples for u in g)))
    kept = {id(u) for u in best}
    dropped = [Dropped(u.agent_id, RejectReason.BAD_SHAPE, f"{what} layout differs from the majority's")
               for u in updates if id(u) not in kept]
    return best, dropped


def check_base(update: Update, state: FamilyState | None) -> Reject | None:
    """The update must start from the state the round announced for its family."""
    if state is not None and update.base_digest != state.digest:
        return Reject(RejectReason.STALE_BASE, f"trained from {update.base_digest}, not {state.digest}")
    return None


def layout_problem(arrays: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray], what: str) -> Reject | None:
    """``bad_shape`` (the protocol's reason) unless ``arrays`` has the names, shapes and dtypes of ``like``."""
    try:
        check_layout(arrays, layout_of(like), what)
    except ProtocolError as exc:
        return Reject(exc.reason, exc.detail)
    return None


def group_by_family(updates: Sequence[Update]) -> dict[str, list[Update]]:
    """Updates per family, each group in agent-id order: floating-point sums then do not
    depend on the order in which updates happened to arrive, so runs reproduce."""
    groups: dict[str, list[Update]] = {}
    for update in sorted(updates, key=lambda u: u.agent_id):
        groups.setdefault(update.family, []).append(update)
    return groups
