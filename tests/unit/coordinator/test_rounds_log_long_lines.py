"""rounds.jsonl's crash repair with a summary line longer than its 64 KiB read (clipped_claims, clipped_norms and
secure accounts name agents; a round may select 10,000): it read only the last 64 KiB, so it logged a round twice
and left a torn long line for the next append to glue onto (found in review). It now reads backwards a chunk at a
time."""
from __future__ import annotations

import json
from pathlib import Path

from coordinator.state.rounds import RoundSummary
from coordinator.state.rounds_log import RoundsLog


def summary(number: int, agents: int = 6000) -> RoundSummary:
    return RoundSummary(round=number, task="train", outcome="completed", reason=None, selected=agents,
                        answered=agents, stragglers=0, dropouts=0, rejected=0, quorum=1, duration_s=1.0,
                        deadline_s=10.0, bytes_in=0, bytes_out=0, accuracy=None, loss=None, train_loss=None,
                        closed_at=0.0, clipped_claims=[f"agent-{i:06d}" for i in range(agents)])


def test_a_restart_does_not_log_a_long_round_twice(tmp_path: Path) -> None:
    log = RoundsLog(tmp_path / "rounds.jsonl")
    last = summary(1)
    assert len(json.dumps(last.to_dict())) > 64 * 1024
    log.append(last)  # the round's line was written, then the process was killed
    log.reconcile(last)  # restart: the checkpoint's last round is round 1, already logged
    assert [s.round for s in log.read()] == [1]  # fails: round 1 appended a second time


def test_a_torn_long_line_is_cut_whole(tmp_path: Path) -> None:
    path = tmp_path / "rounds.jsonl"
    log = RoundsLog(path)
    log.append(summary(1, agents=10))
    line = json.dumps(summary(2).to_dict()) + "\n"
    with path.open("a") as handle:  # SIGKILL mid-write of round 2's long line (its checkpoint not yet written)
        handle.write(line[: len(line) - 100])
    log.reconcile(summary(1, agents=10))
    log.append(summary(2, agents=10))  # round 2 re-run after the restart
    rounds = []
    for text in path.read_text().splitlines():
        try:
            rounds.append(json.loads(text)["round"])
        except ValueError:
            rounds.append("unreadable")
    assert rounds == [1, 2]  # fails: the torn remnant is left, and round 2's line is glued onto it


def test_a_damaged_round_number_is_skipped_not_fatal(tmp_path: Path) -> None:
    """A line whose round is 1e999 (``json.loads`` gives inf) made ``int`` raise OverflowError, which the repair did not
    catch: start-up died with a bare traceback (found in review)."""
    path = tmp_path / "rounds.jsonl"
    path.write_bytes(json.dumps({"round": 4}).encode() + b"\n" + b'{"round": 1e999}\n')
    assert RoundsLog(path)._repair_tail() == 4
