"""What a site checks of its agents' payloads in place of the root's strategy: it holds no global state, so it checks
against the announcement (the base digest, SCAFFOLD's control layout) and the task card (FedProto's shape)."""

from __future__ import annotations

import numpy as np

from coordinator.admission.decisions import Reject
from coordinator.admission.task_agreement import fingerprint_of
from coordinator.reasons import RejectReason
from coordinator.strategies.fedproto import prototypes_problem
from coordinator.strategies.scaffold import check_control_names
from protocol.messages import RoundAnnouncement, Update
from protocol.task_card import TaskCard

FOLDED = ("fedavg", "fedprox", "scaffold", "fedproto")
"""The algorithms whose plain updates a site folds (FedProto's prototypes into per-class sums, in plain rounds only:
in a secure round its agents mask them in the site's session, ``coordinator/sites/secure.py``, and a plain one is
refused, ``site_unsupported``)."""


class SitePayloads:
    """The strategy's payload checks, against the announcement (the site holds no global state): the base an
    update names must be the announced state's digest; under FedAvg, FedProx and SCAFFOLD a family without one
    bootstraps (weights), and the delta's layout is checked by the task agreement against the fingerprint the round
    announced for its family; under FedProto, prototypes shaped as the task card says and counts within the
    samples claimed."""

    def __init__(self, card: TaskCard) -> None:
        self.card = card
        self.announcement: RoundAnnouncement | None = None

    def check_update(self, update: Update) -> Reject | None:
        assert self.announcement is not None
        if self.announcement.algorithm not in FOLDED and update.task == "train":
            return Reject(RejectReason.SITE_UNSUPPORTED, f"a site aggregator does not fold "
                                                         f"{self.announcement.algorithm}'s plain updates")
        if self.announcement.algorithm == "fedproto" and update.task == "train":
            return self._check_prototypes(update)
        ref = self.announcement.states.get(update.family)
        if ref is None:
            if not update.weights:
                return Reject(RejectReason.MISSING_PAYLOAD, f"family {update.family} bootstraps: send weights")
            return self._check_control(update, update.weights)
        if update.base_digest != ref.digest:
            return Reject(RejectReason.STALE_BASE, f"trained from {update.base_digest}, not {ref.digest}")
        if not update.delta:
            return Reject(RejectReason.MISSING_PAYLOAD, "a training update must carry a delta")
        return self._check_control(update, update.delta)

    def _check_control(self, update: Update, model: dict[str, np.ndarray]) -> Reject | None:
        """SCAFFOLD's control delta: present, and laid out as the announced server variate (a bootstrap's, named
        and shaped like parameters of the weights it sent; the root's majority settles which)."""
        assert self.announcement is not None
        if self.announcement.algorithm != "scaffold" or update.task != "train":
            return None
        if not update.control_delta:
            return Reject(RejectReason.MISSING_PAYLOAD, "a scaffold update must carry a control_delta")
        expected = self.announcement.control_layouts.get(update.family)
        if update.family not in self.announcement.states:
            return check_control_names(update.control_delta, model, "control_delta")
        if expected is None or fingerprint_of(update.control_delta) != expected:
            return Reject(RejectReason.BAD_SHAPE, f"control_delta's layout is not the announced {expected}")
        return None

    def _check_prototypes(self, update: Update) -> Reject | None:
        """FedProto, as the root's strategy checks it, with the task's ``[classes, embedding_dim]`` for the shape (the
        site holds no global prototypes); not in a secure round (its agents mask them in the site's session: one sent
        in the clear there would be folded outside the sum)."""
        assert self.announcement is not None
        if self.announcement.secure is not None:
            return Reject(RejectReason.SITE_UNSUPPORTED, "a secure round takes fedproto's prototypes masked, in the "
                                                         "site's session, not in the clear")
        ref = self.announcement.states.get(update.family)
        if ref is not None and update.base_digest != ref.digest:
            return Reject(RejectReason.STALE_BASE, f"trained from {update.base_digest}, not {ref.digest}")
        return prototypes_problem(update, (self.card.num_classes, self.card.embedding_dim or 0))

    def check_delta(self, update: Update) -> Reject | None:
        return self.check_update(update)
