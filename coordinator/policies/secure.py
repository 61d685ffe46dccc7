"""Secure rounds (``secure_aggregation``): synchronous rounds whose training answers arrive masked.

The policy of a run with SecAgg+ on: it selects and times rounds as ``sync`` does, refuses plain
training updates in a round announced as secure (only masked inputs count there, through the
stages of ``coordinator/round/secure.py``; a family without a state may still bootstrap beside them, plainly,
with seeded weights), and closes such a round when its secure session is done
(the sum unmasked, or the round failed), not at its deadline: the unmasking stage runs past it.
Bootstrap and evaluation rounds stay plain and close as synchronous rounds do.
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.admission.decisions import Decision, Reject
from coordinator.admission.view import AdmissionView
from coordinator.policies.registry import POLICIES
from coordinator.policies.synchronous import SynchronousPolicy
from coordinator.reasons import RejectReason
from coordinator.state.rounds import OpenRound
from protocol.messages import Update
from protocol.topics import ParsedTopic


class SecurePolicy(SynchronousPolicy):
    name = "secagg"

    def decide(self, topic: ParsedTopic, update: Update, view: AdmissionView) -> Decision:
        open_round = view.open_round
        secure = open_round.announcement.secure if open_round is not None else None
        if (secure is not None and open_round is not None and update.task == "train"
                and update.round == open_round.number and not _bootstrap(update, secure.families)):
            return Reject(RejectReason.SECURE_ONLY, f"round {update.round} is securely aggregated: send the masked "
                                                    f"input through its stages, not a plain update")
        return super().decide(topic, update, view)

    def closes(self, open_round: OpenRound, now: float) -> bool:
        if open_round.announcement.secure is not None:
            return open_round.secure_done
        return super().closes(open_round, now)


def _bootstrap(update: Update, sessions: Mapping[str, object]) -> bool:
    """A bootstrap proposal of a family without a session: seeded weights (nothing learned from data), no delta and
    no prototypes. Anything else in a secure round leaves masked; the strategy checks the family has no state."""
    return (update.family not in sessions and bool(update.weights) and not update.delta
            and update.prototypes is None)


POLICIES.register("secagg", lambda settings: SecurePolicy(), summary=(
    "synchronous rounds securely aggregated (SecAgg+): chosen by secure_aggregation, not by mode"),
    settings=("secure_aggregation", "secagg_degree", "secagg_threshold", "secagg_prg", "secagg_clip",
              "secagg_control_clip", "secagg_stage_s"))
