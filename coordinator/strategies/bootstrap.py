"""A family's first global state: the proposal a strict majority of its bootstrap round's agents sent, exactly.

Agents of one task build a family's model from the announced ``init_seed`` and, in its bootstrap
round, send those initial weights untrained: honest proposals are byte-identical, so they agree by
digest (names, dtypes, shapes and bytes, as ``protocol.digest`` hashes them). The proposal sent by
more than half of the family's voters (one vote per agent, whatever it claims to hold; at least three of
its selected agents, or all if fewer; votes carried over its bootstrap rounds while their agents stay
selected: ``Strategy.first_state``) becomes the state as sent; the others are counted as
``bootstrap_disagrees``. Without a strict majority nothing is adopted: the family stays without state,
its next round bootstraps again, and every proposal is counted with the tally so far, so no single
device, nor a tie, chooses it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.reasons import RejectReason
from protocol.digest import digest_arrays
from protocol.messages import Update

log = logging.getLogger("coordinator.strategies.bootstrap")


@dataclass(frozen=True)
class Agreement:
    kept: list[Update]
    """The majority's proposals (identical in ``fields``); empty when no proposal had a strict majority."""
    rejected: list[tuple[str, RejectReason, str]]
    """(agent, reason, detail) for every proposal not kept."""
    digest: str | None
    """The agreed proposal's digest; None without a strict majority."""


def proposal_digest(update: Update, fields: Sequence[str]) -> str:
    """The digest of ``update``'s bootstrap payload: each field in ``fields``, as it travels."""
    return digest_arrays([(name, getattr(update, name)) for name in fields])


def agree_by_votes(family: str, proposals: Sequence[Update], votes: Mapping[str, str], least: int = 0) -> Agreement:
    """``proposals`` (this round's) whose digest more than half of the voters chose: ``votes`` maps every agent that
    proposed for the family so far (this round and earlier ones, until it has a state) to its latest proposal's
    digest ("": one that cannot be adopted), and there are at least ``least`` voters (the family's selected agents,
    up to three: one agent alone is no majority). The kept proposals must be this round's: a digest that wins on
    earlier votes alone is adopted once a proposal with it comes again."""
    total = max(len(votes), least)
    counts: dict[str, int] = {}
    for digest in votes.values():
        if digest:
            counts[digest] = counts.get(digest, 0) + 1
    present = {votes.get(u.agent_id, "") for u in proposals}
    winners = [d for d, n in counts.items() if 2 * n > total and d in present]
    if winners:
        digest = winners[0]
        kept = sorted((u for u in proposals if votes.get(u.agent_id) == digest), key=lambda u: u.agent_id)
        rejected = [(u.agent_id, RejectReason.BOOTSTRAP_DISAGREES,
                     f"its proposal {votes.get(u.agent_id, '')[:12]} for {family} differs from {digest[:12]}, sent by "
                     f"{counts[digest]} of {total}") for u in proposals if votes.get(u.agent_id) != digest]
        return Agreement(kept, rejected, digest)
    tally = ", ".join(f"{d[:12]} x{n}" for d, n in sorted(counts.items(), key=lambda item: -item[1]))
    detail = (f"no proposal for {family} has a strict majority of {total} yet ({tally}): its votes carry over to its "
              f"next bootstrap round")
    log.warning("family %s adopts no first state: %s", family, detail)
    return Agreement([], [(u.agent_id, RejectReason.BOOTSTRAP_DISAGREES, detail) for u in proposals], None)


def owned(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Copies of ``arrays``: a kept proposal may be a view of the round's rows, which close with the round."""
    return {name: np.array(array, copy=True) for name, array in arrays.items()}
