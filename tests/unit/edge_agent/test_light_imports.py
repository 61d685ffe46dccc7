"""An agent loads only what its run uses: each heavy package costs tens of MB resident on a phone.

Each case starts a fresh interpreter, imports the CLI module, builds a phone-profile agent on the
built-in digits exactly as ``edge-agent run`` does, trains one real round (no broker needed: the
worker answers an announcement), and reports what ``sys.modules`` holds. Memory itself is
measured by bench/memory.py, not here: it is noisy; which modules load is not.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.chart import REPO

RUN_ONE_ROUND = """
import json, sys, tempfile, time
import edge_agent.cli  # the entry point's own imports
from edge_agent.bootstrap import build_agent
from edge_agent.config import AgentSettings
from protocol.messages import LocalTraining, RoundAnnouncement

settings = AgentSettings(device="phone", state_dir=tempfile.mkdtemp(), **json.loads(sys.argv[1]))
agent = build_agent(settings)
worker = agent.worker
announcement = RoundAnnouncement(
    run_id="run-1", round=1, task="train", task_ref=worker.task.card.ref, layouts={worker.family: worker.layout},
    algorithm="fedavg", training=LocalTraining(epochs=1, learning_rate=0.05, momentum=0.9), params={},
    selected=[agent.agent_id], states={}, init_seed=0, issued_at=time.time(), deadline_s=60.0, last_round=1)
update = worker.answer(announcement, None)
assert update.weights, "the bootstrap round sends weights"
print(json.dumps(sorted(sys.modules)))
"""

NEVER = ("sklearn", "pandas", "pyarrow", "matplotlib", "sktime", "mlxtend", "PIL", "torch._dynamo")
"""Not used by an agent on the built-in digits, with or without DP. torch._dynamo (and sympy with it)
is what torch.optim loads on first use: edge_agent.sgd trains without it."""


def _modules_after_one_round(settings: dict[str, object]) -> set[str]:
    done = subprocess.run([sys.executable, "-c", RUN_ONE_ROUND, json.dumps(settings)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if n in modules]


def test_phone_agent_without_dp_loads_no_opacus_scipy_sklearn_or_compiler() -> None:
    modules = _modules_after_one_round({})
    assert "torch" in modules and "edge_agent.training" in modules  # it really trained
    assert _loaded(modules, (*NEVER, "opacus", "scipy", "sympy")) == []


def test_phone_agent_with_dp_loads_opacus_but_not_the_rest() -> None:
    modules = _modules_after_one_round({"dp": True, "dp_noise_multiplier": 1.0})
    assert "opacus" in modules and "edge_agent.privacy.dp_training" in modules
    assert _loaded(modules, NEVER) == []
