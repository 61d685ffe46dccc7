"""A user's task, installed like a package, trained by the real CLIs over Mosquitto.

The example package ``examples/custom_task`` is pip-installed into a folder of its own (on
PYTHONPATH, so this environment stays as it was); its generator draws each device's image
folder. A coordinator told the task by its card and three agents of that task run three
rounds; a fourth agent runs another task and must be refused, counted, and never selected.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from protocol.arrays import layout_of
from protocol.messages import AgentStatus, GlobalState, RoundAnnouncement, TaskRef, Update
from protocol.tasks import TaskCard, layout_fingerprint
from protocol.topics import Topics
from tests.integration.wire import (
    WireRecorder,
    assert_agents_exit_cleanly,
    assert_all_completed,
    decode_wire,
    metric,
    retained_messages,
    scrape,
    wait_for_rounds,
    wait_until,
)

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_task"
FEDERATION = "shapes"
ROUNDS = 3
SHAPES = TaskRef(name="shapes", version="1.0")


def _install_example(tmp_path: Path) -> dict[str, str]:
    """pip-install a copy of the example into its own folder; the environment that sees it."""
    source, site = tmp_path / "example-src", tmp_path / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "edge_agent", *args], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _expected_layouts(env: dict[str, str]) -> dict[str, str]:
    """Each family's layout fingerprint, computed apart from the fleet by the installed package."""
    script = ("import json; from shapes_task import task; from edge_agent.weights import layout_of_model; "
              "print(json.dumps({f: [[n, list(s), d] for n, (s, d) in layout_of_model(task.build_model(f, 0)).items()]"
              " for f in task.families}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    layouts = json.loads(done.stdout)
    return {family: layout_fingerprint({n: (tuple(s), d) for n, s, d in rows}) for family, rows in layouts.items()}


def test_an_installed_task_trains_over_the_wire(tmp_path: Path, mosquitto: MosquittoBroker, recorder: WireRecorder,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    env = _install_example(tmp_path)
    listing = _cli(env, "tasks")
    assert any(line.split()[:2] == ["shapes", "1.0"] and "edgefl-shapes-task" in line for line in listing.splitlines())
    card_path = tmp_path / "shapes.json"
    card_path.write_text(_cli(env, "tasks", "--card", "shapes"))
    card = TaskCard.model_validate_json(card_path.read_bytes())
    assert (card.ref, card.families) == (SHAPES, ("small_cnn", "wide_cnn"))
    expected_layouts = _expected_layouts(env)

    data = tmp_path / "device-data"
    done = subprocess.run([sys.executable, "-m", "shapes_task.make_data", str(data), "--devices", "3",
                           "--per-class", "60"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    (data / "device-2" / "circle" / "broken.png").write_bytes(b"not a png")  # dropped and counted, not fatal

    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the fleet's processes see the installed task
    agents = [AgentSpec("jetson-0", "jetson", 0, {"data": str(data / "device-0")}),
              AgentSpec("rpi-1", "rpi", 1, {"data": str(data / "device-1")}),
              AgentSpec("phone-2", "phone", 2, {"data": str(data / "device-2")}),
              AgentSpec("cpu-intruder", "cpu", 3, {"task": "digits", "data": "digits"})]
    http_port = free_port()
    fleet = Fleet(tmp_path / "run", mosquitto.url, FleetSpec(agents=agents, task="shapes", partition="none"), {
        "task": str(card_path), "rounds": ROUNDS, "min_available_agents": 3, "min_fit_agents": 3,
        "local_epochs": 3, "learning_rate": 0.02, "batch_size": 16, "http_port": http_port,
        "exit_when_finished": False,
    }, federation=FEDERATION)
    topics = Topics(FEDERATION)
    try:
        # The intruder first, listening before any round: a run that ended before it subscribed would show it
        # only the "finished" status, and it would exit without seeing a round of the other task.
        fleet.start_coordinator()
        fleet.agents["cpu-intruder"].start()
        wait_until(lambda: any(topics.parse(m.topic).agent_id == "cpu-intruder" and m.payload
                               for m in recorder.snapshot(lambda m: "/status" in m.topic)), 120,
                   "the intruder's status")
        for name, process in fleet.agents.items():
            if name != "cpu-intruder":
                process.start()
        rounds = wait_for_rounds(fleet, ROUNDS + 1, 240)
        wait_until(lambda: metric(scrape(http_port), "fl_messages_rejected_total", kind="agent_status",
                                  reason="task_mismatch") >= 1, 30, "the intruder's status counted")
        assert_agents_exit_cleanly(fleet, 60)
        samples = scrape(http_port)
        retained = retained_messages(mosquitto.url, f"fl/{FEDERATION}/#")
    finally:
        fleet.stop()
    assert not fleet.failures(), [p.log_tail() for p in fleet.failures()]
    assert_all_completed(rounds, ROUNDS + 1)
    assert all(r["answered"] == 3 for r in rounds)

    seen = [(topics.parse(m.topic), m) for m in recorder.snapshot()]
    announcements = {a.round: a for a in (decode_wire(m.payload, RoundAnnouncement) for p, m in seen
                                          if p.kind == "round" and m.payload)}
    assert sorted(announcements) == list(range(1, ROUNDS + 2))
    for ann in announcements.values():
        assert ann.task_ref == SHAPES
        assert sorted(ann.selected) == ["jetson-0", "phone-2", "rpi-1"]  # never the agent of another task
        assert ann.layouts == {"wide_cnn": expected_layouts["wide_cnn"], "small_cnn": expected_layouts["small_cnn"]}

    updates = [decode_wire(m.payload, Update) for p, m in seen if p.kind == "update"]
    assert len(updates) == 3 * (ROUNDS + 1)
    assert {u.agent_id for u in updates} == {"jetson-0", "rpi-1", "phone-2"}
    for update in updates:
        assert update.task_ref == SHAPES
        arrays = update.weights or update.delta
        if update.task == "train":
            assert layout_fingerprint(layout_of(arrays)) == expected_layouts[update.family]
    assert {u.family for u in updates} == {"wide_cnn", "small_cnn"}
    states = [decode_wire(m.payload, GlobalState) for p, m in seen if p.kind == "global_state" and m.payload]
    for state in states:
        assert layout_fingerprint(layout_of(state.weights)) == expected_layouts[state.family]

    final = [u for u in updates if u.task == "evaluate"]
    assert len(final) == 3 and all(u.metrics.eval_accuracy is not None for u in final)
    # Four classes: chance is 0.25. Seeds fix the data and the models, so this is not a timing matter.
    mean = sum(u.metrics.eval_accuracy * u.metrics.num_eval_samples for u in final) / sum(  # type: ignore[operator]
        u.metrics.num_eval_samples for u in final)
    assert mean > 0.5, mean

    # The intruder says why in its status, and the coordinator counted it.
    intruder = decode_wire(retained[topics.agent_status("cpu-intruder")], AgentStatus)
    assert intruder.task_ref == TaskRef(name="digits", version="1")
    assert intruder.problem is not None and "shapes@1.0" in intruder.problem and "digits@1" in intruder.problem
    assert metric(samples, "fl_messages_rejected_total", kind="agent_status", reason="task_mismatch") >= 1
    assert metric(samples, "fl_messages_rejected_total", kind="update", reason="task_mismatch") == 0
    # The corrupt image was dropped, and that agent's log names it.
    log_text = (fleet.agent_dir("phone-2") / "agent.log").read_text()
    assert "corrupt_image" in log_text and "broken.png" in log_text
    assert "refusing rounds (task_mismatch)" in (fleet.agent_dir("cpu-intruder") / "agent.log").read_text()
