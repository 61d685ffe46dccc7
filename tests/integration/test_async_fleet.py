"""FedBuff through the real CLIs over Mosquitto: fast agents, a slow one, and one training with DP.

What a run must show, however fast this machine is: every version and the evaluation complete;
every update is either admitted (with its staleness counted) or dropped as too stale, late
(after the last version), or, for version 1's weights, as having no base to be a delta of; the
staleness histogram counts exactly the admitted training updates; the DP agent's updates are admitted and carry the epsilon it spent.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec
from protocol.messages import RoundAnnouncement, Update
from tests.integration.chaos import WireView, small_fleet
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    metric,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

FEDERATION = "fedbuff"
VERSIONS = 6
REPLAY_VERSIONS = 12
"""The replay test's run: long enough that no machine runs past it while the test pauses the agents."""
DP = {"dp": True, "dp_noise_multiplier": 1.0}
AGENTS = [AgentSpec("rpi-0", "rpi", 0), AgentSpec("rpi-1", "rpi", 1), AgentSpec("phone-2", "phone", 2, DP),
          AgentSpec("cpu-slow", "cpu", 3, {"straggler_delay": "constant:4"})]
"""Three families: cnn_small (the two rpi agents), mlp_tiny (phone-2) and cnn_large (the slow one, alone). A family's
first state needs a strict majority of (up to three of) its selected agents, its votes carried over buffers: the rpi
family's once both its proposals came, the others' with their one."""


def test_fedbuff_versions_admit_stale_work_and_dp_agents(tmp_path: Path, mosquitto: MosquittoBroker,
                                                         recorder: WireRecorder) -> None:
    fleet = small_fleet(tmp_path / "run", mosquitto.url, FEDERATION, AGENTS, {
        "mode": "async", "buffer_size": 2, "max_staleness": VERSIONS, "rounds": VERSIONS, "min_fit_agents": 1,
        "round_deadline_s": 60.0, "max_norm_ratio": 0,  # buffers of 2 hold no median norm (the settings say so)
    })
    with fleet:
        rounds = wait_for_rounds(fleet, VERSIONS + 1, 240)
        assert_agents_exit_cleanly(fleet, 60)
        samples = scrape(fleet.http_port)
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert_all_completed(rounds, VERSIONS + 1)
    assert all(r["stragglers"] == 0 for r in rounds)  # agents outside a buffer are working, not late

    seen = recorder.snapshot()
    announcements = [decode_wire(m.payload, RoundAnnouncement) for m in seen if m.topic.endswith("/rounds/current")
                     and m.payload]
    assert all(sorted(a.selected) == sorted(s.name for s in AGENTS) for a in announcements)  # everyone, always
    updates = [decode_wire(m.payload, Update) for m in seen if f"fl/{FEDERATION}/updates/" in m.topic]
    train = [u for u in updates if u.task == "train"]
    rejected = {reason: metric(samples, "fl_messages_rejected_total", kind="update", reason=reason)
                for reason in ("too_stale", "late", "duplicate", "stale_base", "deferred_overflow", "wrong_round",
                               "bootstrap_disagrees")}
    accepted = metric(samples, "fl_updates_total", outcome="accepted")
    # A proposal refused as bootstrap_disagrees was accepted into its buffer first (and dropped as it closed).
    refused = sum(n for reason, n in rejected.items() if reason != "bootstrap_disagrees")
    assert accepted + refused == len(updates), (accepted, rejected, len(updates))
    assert rejected["duplicate"] == 0, rejected
    # An update that waits for a buffer gives way to its agent's newer one (deferred_overflow: "one of version N
    # takes its place"), as fast agents do when versions close in a tenth of a second. One waits per agent, so the
    # queue's own bound (64) is never reached with four: each of these is work its agent had already superseded.
    assert rejected["deferred_overflow"] <= len(train) - len(AGENTS), rejected
    # Each family adopts one of its proposals at least (the rpi family's may wait a buffer for its second vote: the
    # first is then refused as bootstrap_disagrees, its vote kept); weights after that have no delta base.
    bootstraps = sum(1 for u in train if u.weights)
    assert rejected["stale_base"] + rejected["bootstrap_disagrees"] <= bootstraps - 3, (rejected, bootstraps)
    assert rejected["wrong_round"] == 0, rejected
    evaluated = sum(1 for u in updates if u.task == "evaluate")
    assert metric(samples, "fl_update_staleness_versions_count") == accepted - evaluated
    assert len(train) - (accepted - evaluated) == (rejected["too_stale"] + rejected["late"] + rejected["stale_base"]
                                                   + rejected["deferred_overflow"])
    dp = [u for u in train if u.agent_id == "phone-2"]
    assert dp and all(u.privacy is not None for u in dp)
    # A bootstrap proposal is the seeded model, untrained: it touches no data and spends nothing.
    trained = [u for u in dp if not u.weights]
    assert trained and all(u.privacy.epsilon > 0 for u in trained)  # type: ignore[union-attr]
    assert all(u.privacy.epsilon == 0 and u.metrics.steps == 0 for u in dp if u.weights)  # type: ignore[union-attr]


def test_a_replayed_update_counts_once(tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder) -> None:
    """Each agent's signed update of version 2, captured from the open broker and published again verbatim
    once version 4 is open: every copy is a duplicate, none weighs in a second buffer.

    However fast this machine is, the copies are judged during training versions and for what they are:
    max_staleness spans the whole run (never ``too_stale``), and the agents are paused (SIGSTOP) as soon as
    version 4 is announced, before anything else, until every copy is counted. So the run cannot reach its
    evaluation round first: what was in flight when they stopped closes a buffer or two, not the eight versions
    left. (With 6 versions, and the pause after connecting the replayer, a clean-clone CI run once got past
    version 6 first: no copy was counted as a duplicate in 60 s.)"""
    agents = [AgentSpec("rpi-0", "rpi", 0), AgentSpec("rpi-1", "rpi", 1), AgentSpec("phone-2", "phone", 2)]
    fleet = small_fleet(tmp_path / "run", mosquitto.url, "replayed", agents, {
        "mode": "async", "buffer_size": 2, "max_staleness": REPLAY_VERSIONS, "rounds": REPLAY_VERSIONS,
        "min_fit_agents": 1, "round_deadline_s": 60.0, "max_norm_ratio": 0,
    })
    view = WireView(recorder, "replayed")
    with fleet:
        view.wait_announced(4, 120)
        paused = [process for process in fleet.processes() if process is not fleet.coordinator]
        for process in paused:
            os.kill(process.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        replayer = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="replayer")
        try:
            originals = recorder.snapshot(lambda m: "/updates/" in m.topic and view.topics.parse(m.topic).round == 2)
            assert originals, "no update of version 2 on the wire"
            host, port = mosquitto.url.removeprefix("mqtt://").split(":")
            replayer.connect(host, int(port))
            replayer.loop_start()
            for message in originals:
                replayer.publish(message.topic, message.payload, qos=1).wait_for_publish(10)
            wait_until(lambda: metric(scrape(fleet.http_port), "fl_messages_rejected_total", kind="update",
                                      reason="duplicate") >= len(originals), 60, "every copy judged")
        finally:
            for process in paused:
                os.kill(process.pid, signal.SIGCONT)  # type: ignore[arg-type]
            replayer.disconnect()
            replayer.loop_stop()
        rounds = wait_for_rounds(fleet, REPLAY_VERSIONS + 1, 240)
        samples = scrape(fleet.http_port)
    assert_all_completed(rounds, REPLAY_VERSIONS + 1)
    duplicates = metric(samples, "fl_messages_rejected_total", kind="update", reason="duplicate")
    assert duplicates == len(originals), (duplicates, len(originals))
    # Every update message on the wire, replays included, was either accepted once or rejected with a reason.
    on_wire = len(recorder.snapshot(lambda m: "/updates/" in m.topic))
    outcomes = {o: metric(samples, "fl_updates_total", outcome=o) for o in ("accepted", "rejected")}
    assert outcomes["accepted"] + outcomes["rejected"] == on_wire, (outcomes, on_wire)
