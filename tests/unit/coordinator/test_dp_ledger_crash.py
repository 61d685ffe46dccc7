"""Distributed DP across a crash (found in review): a secure round's noisy sum is unmasked and charged to the
in-memory ledger on the loop, but the ledger reached disk only with the round's checkpoint, written later by the
background close job. Killed in between, the coordinator restarted with the ledger of the round before: the release
was never charged and the round ran again with fresh noise. The open round's state file now says, before the reveals
are asked for, that they are; a restart charges such a round as released (and no other)."""
from __future__ import annotations

from concurrent.futures import Executor, Future
from pathlib import Path

from tests.unit.coordinator.test_engine import Clock, make_engine
from tests.unit.coordinator.test_secure_noise import NOISE
from tests.unit.coordinator.test_secure_rounds import SECURE, Fleet, deltas


class KilledBeforeTheJobEnds(Executor):
    """The background thread took the closing job and the process was killed before it finished."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        return Future()


def test_a_released_noisy_sum_stays_charged_after_a_crash_before_the_checkpoint(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, **NOISE)
    ann = fleet.announcement()
    assert ann.round == 2 and ann.secure is not None and ann.secure.noise is not None
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()
    fleet.train(deltas(9))
    fleet.engine.background = KilledBeforeTheJobEnds()
    fleet.pump()  # advertise, share, mask, unmask: the noisy sum is released to the root
    assert fleet.engine.engine.parts.central_ledger.rounds == 1  # charged, in memory
    assert fleet.engine.closing_job is not None and not fleet.engine.closing_job.done()

    again, _, _ = make_engine(tmp_path, Clock(), **{**SECURE, **NOISE})  # SIGKILL, restart from the state dir
    again.tick()
    assert again.engine.parts.central_ledger.rounds >= 1  # fails: 0, the release is forgotten


def test_a_restart_before_the_reveals_were_asked_for_charges_nothing(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, **NOISE)
    ann = fleet.announcement()
    for participant in fleet.agents.values():
        participant.begin(ann)
    fleet.pump()  # keys advertised and shared; no masked input yet, so no reveal asked for
    again, _, _ = make_engine(tmp_path, Clock(), **{**SECURE, **NOISE})
    again.tick()
    assert again.engine.parts.central_ledger.rounds == 0
