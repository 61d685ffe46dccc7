"""Start, stop and kill a coordinator and N edge agents as separate processes (a killed one can start again).

Each process runs its package's CLI (``python -m coordinator run``, ``python -m edge_agent run``)
with settings passed as ``--flags``, has its own state directory under the run directory, and
logs to a file there. Nothing here imports the coordinator or the agent: they only meet on
the broker, as they would on real devices (only ``FleetSpec.family_of``, for reports after a
run, loads the task's code).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from launcher.forked import FORK_BY_DEFAULT, ForkedChild, ForkServer
from launcher.lifeline import die_with_parent
from protocol.tasks import BUILTIN_CARDS

DEVICES = ("jetson", "rpi", "phone")


@dataclass(frozen=True)
class AgentSpec:
    name: str
    """Agent id on the wire and name of its state directory."""
    device: str
    partition_index: int
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Edge-agent settings for this agent alone (e.g. a straggler delay); they win over the fleet's."""


@dataclass
class FleetSpec:
    agents: list[AgentSpec]
    task: str = "digits"
    """The agents' task (an installed task's name or package.module:attr); the coordinator's too, unless its
    settings name one (a built-in task is known by name, another by a card that ``Fleet.start`` writes)."""
    data: str | None = None
    """The agents' data source, as their task reads it; None: the task's built-in set."""
    partition: str = "dirichlet"
    alpha: float = 1.0
    data_seed: int = 0
    threads: int = 1
    """torch threads per agent: several agents share few cores, so more only thrashes."""
    agent_settings: dict[str, Any] = field(default_factory=dict)
    """Further edge-agent settings (field name -> value), passed as flags."""

    def family_of(self, agent: AgentSpec) -> str:
        """The model family ``agent`` trains: its ``family`` setting, else the one its task gives its device.

        Loads the task's code (and torch): for reports after a run, not needed to start one.
        """
        settings = {**self.agent_settings, **agent.settings}
        return settings.get("family") or _device_families(settings.get("task", self.task))(agent.device)


@functools.cache
def _device_families(task: str) -> Callable[[str], str]:
    from edge_agent.tasks.registry import resolve_task

    return resolve_task(task).family_for


def default_fleet(count: int, devices: Iterable[str] = DEVICES) -> list[AgentSpec]:
    """``count`` agents cycling through ``devices``; agent i holds partition i."""
    kinds = list(devices)
    return [AgentSpec(f"{kinds[i % len(kinds)]}-{i}", kinds[i % len(kinds)], i) for i in range(count)]


def as_flags(settings: Mapping[str, Any]) -> list[str]:
    """``{"local_epochs": 5, "exit_when_finished": True}`` -> ``["--local-epochs", "5", "--exit-when-finished"]``."""
    flags: list[str] = []
    for name, value in settings.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags


class ManagedProcess:
    """One child process with a log file; start it again with the same command after a stop or kill.

    ``forked``: the command (``python -m module ...``) runs in a fork of a parent that has imported torch and
    the agent's code already (``launcher/forkserver.py``), not in a fresh interpreter: the same process as far as
    the broker, signals and exit codes go, without some 3 CPU seconds of imports per start.
    """

    def __init__(self, name: str, argv: list[str], log_path: Path, env: Mapping[str, str] | None = None,
                 *, forked: bool = False) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = dict(env or os.environ)
        self.forked = forked
        self.process: subprocess.Popen[bytes] | ForkedChild | None = None
        self.starts = 0

    def start(self) -> ManagedProcess:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.forked:
            self.process = ForkServer.shared(self.argv, self.env).spawn(self.argv, self.env, self.log_path)
            self.starts += 1
            return self
        with self.log_path.open("ab") as log_file:
            # Own session: a Ctrl-C in the terminal reaches only the launcher, which then stops
            # the children in order (agents first) instead of all of them racing to exit.
            self.process = subprocess.Popen(
                self.argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True, preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        self.starts += 1
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit code, or None if still running after ``timeout_s``."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (a clean stop: the agent says it is offline), then SIGKILL after ``timeout_s``."""
        if not self.running:
            return self.returncode
        assert self.process is not None
        self.process.terminate()
        code = self.wait(timeout_s)
        return code if code is not None else self.kill()

    def kill(self) -> int | None:
        """SIGKILL: like pulling the plug; the broker publishes the last will."""
        if self.running:
            assert self.process is not None
            self.process.kill()
        return self.wait(10.0)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def run_to_end(what: str, argv: list[str], log_path: Path, env: Mapping[str, str] | None = None, *,
               forked: bool = FORK_BY_DEFAULT, timeout_s: float = 120.0) -> None:
    """Run a short command (``coordinator enroll``...) to its end; raise with its log's tail if it fails."""
    process = ManagedProcess(what, argv, log_path, env, forked=forked).start()
    code = process.wait(timeout_s)
    if code != 0:
        process.kill()
        outcome = f"ran over {timeout_s:.0f} s" if code is None else f"exited {code}"
        raise RuntimeError(f"{what} failed ({outcome}): {process.log_tail(30)}"[-2000:])


class Fleet:
    """A coordinator and its agents, all talking to ``broker_url``, with state under ``run_dir``."""

    def __init__(self, run_dir: Path, broker_url: str, spec: FleetSpec, coordinator_settings: Mapping[str, Any],
                 *, federation: str = "demo", python: str = sys.executable,
                 forked: bool = FORK_BY_DEFAULT) -> None:
        """``forked``: the coordinator and the agents are forks of parents that imported their code once
        (``ManagedProcess``'s ``forked``); False starts each in a fresh interpreter, as on a device (for measuring
        one's memory)."""
        self.run_dir = Path(run_dir)
        self.broker_url = broker_url
        self.spec = spec
        self.federation = federation
        self.python = python
        self.coordinator_settings: dict[str, Any] = {
            "federation": federation, "broker_url": broker_url, "state_dir": self.coordinator_dir,
            "task": spec.task if spec.task in BUILTIN_CARDS else self.task_card,
            "http_host": "127.0.0.1", "http_port": 0,  # port 0: several demos may run side by side
            "exit_when_finished": True, **coordinator_settings,
        }
        """What the coordinator is started with (its flags)."""
        base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.coordinator = ManagedProcess(
            "coordinator", [python, "-m", "coordinator", "run", *as_flags(self.coordinator_settings)],
            self.coordinator_dir / "coordinator.log", base_env, forked=forked)
        # Thread caps for the BLAS/OpenMP pools torch starts before --threads is applied.
        agent_env = {**base_env, "OMP_NUM_THREADS": str(spec.threads), "MKL_NUM_THREADS": str(spec.threads)}
        self.agents: dict[str, ManagedProcess] = {
            agent.name: ManagedProcess(agent.name, self._agent_argv(agent), self.agent_dir(agent.name) / "agent.log",
                                       agent_env, forked=forked)
            for agent in spec.agents
        }

    # -- layout ----------------------------------------------------------------------------
    @property
    def coordinator_dir(self) -> Path:
        return self.run_dir / "coordinator"

    def agent_dir(self, name: str) -> Path:
        return self.run_dir / "agents" / name

    @property
    def rounds_path(self) -> Path:
        return self.coordinator_dir / "rounds.jsonl"

    @property
    def task_card(self) -> Path:
        """Where ``start`` writes the card of an agents' task that is not built in, for the coordinator."""
        return self.coordinator_dir / "task-card.json"

    @property
    def http_port(self) -> int | None:
        """The coordinator's /metrics port, if its settings name one (0: it picks a free one itself)."""
        return int(self.coordinator_settings["http_port"]) or None

    # -- commands --------------------------------------------------------------------------
    def _agent_argv(self, agent: AgentSpec) -> list[str]:
        s = self.spec
        shared = s.partition == "none" or len(s.agents) == 1  # every agent trains on the whole pool
        merged = {
            "federation": self.federation, "broker_url": self.broker_url, "device": agent.device,
            "agent_id": agent.name, "state_dir": self.agent_dir(agent.name), "task": s.task, "data": s.data,
            "partition": "none" if shared else s.partition,
            "num_partitions": 1 if shared else len(s.agents),
            "partition_index": 0 if shared else agent.partition_index,
            "alpha": s.alpha, "data_seed": s.data_seed, "threads": s.threads, "exit_when_finished": True,
            # the credentials `coordinator enroll` issues in start()
            "signing_key_file": self.agent_dir(agent.name) / "agent_key.pem",
            "coordinator_key": self.agent_dir(agent.name) / "coordinator.pub",
            **s.agent_settings, **agent.settings,
        }
        return [self.python, "-m", "edge_agent", "run", *as_flags(merged)]

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Fleet:
        """Enroll the agents, as an operator would; then the coordinator first, so its retained status
        and first round wait for agents as they come."""
        self.start_coordinator()
        self.start_agents()
        return self

    def start_coordinator(self) -> None:
        """Enroll the agents and start the coordinator alone (``start_agents`` later)."""
        self.enroll()
        if self.coordinator_settings["task"] == self.task_card:
            self.write_task_card()
        self.coordinator.start()

    def start_agents(self) -> None:
        for agent in self.agents.values():
            agent.start()

    def enroll(self) -> None:
        """``coordinator enroll`` every agent: its key and the coordinator's land in its state dir
        (kept when already there, so restarts and a second start keep their identities)."""
        state_dir = self.coordinator_settings["state_dir"]
        argv = [self.python, "-m", "coordinator", "enroll", *self.agents, "--state-dir", str(state_dir),
                "--bundle-dir", str(self.run_dir / "agents")]
        for name in ("enrolled_agents_file", "signing_key_file"):
            if self.coordinator_settings.get(name):
                argv += [f"--{name.replace('_', '-')}", str(self.coordinator_settings[name])]
        run_to_end("enrolling the fleet", argv, self.coordinator_dir / "enroll.log", self.coordinator.env,
                   forked=self.coordinator.forked)

    def write_task_card(self) -> None:
        """The card of the agents' task (``edge-agent tasks --card``), that the coordinator knows it by;
        written by the agents' CLI in their environment, since the task's code is theirs."""
        argv = [self.python, "-m", "edge_agent", "tasks", "--card", self.spec.task]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=self.coordinator.env)
        if done.returncode != 0:
            raise RuntimeError(f"writing the card of task {self.spec.task!r} failed: {done.stdout}{done.stderr}"[-2000:])
        self.task_card.parent.mkdir(parents=True, exist_ok=True)
        self.task_card.write_text(done.stdout)

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def processes(self) -> list[ManagedProcess]:
        return [self.coordinator, *self.agents.values()]

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate everything still running: agents first, then the coordinator."""
        agents = [a for a in self.agents.values() if a.running]
        for agent in agents:
            assert agent.process is not None
            agent.process.terminate()
        deadline = time.monotonic() + timeout_s
        for agent in agents:
            if agent.wait(max(0.1, deadline - time.monotonic())) is None:
                agent.kill()
        self.coordinator.terminate(timeout_s)

    def kill_agent(self, name: str) -> int | None:
        return self.agents[name].kill()

    def kill_coordinator(self) -> int | None:
        return self.coordinator.kill()

    def failures(self) -> list[ManagedProcess]:
        """Processes that exited with a non-zero code."""
        return [p for p in self.processes() if p.returncode not in (None, 0)]
