"""The images built from deploy/*/Dockerfile run a federation, as the Helm chart would run them.

scripts/build-images.sh builds (or reuses, by the digest of their inputs) the coordinator and
CPU agent images with buildah; podman runs them on the host network against a Mosquitto on
127.0.0.1: the coordinator enrolls two agents, then both agent containers train two rounds of
the digits task with the tiny MLP and exit. The coordinator container runs with what the
chart's securityContext asks for (read-only root file system, its user, no capabilities) and
answers the chart's probe paths.

podman's default OCI runtime here, crun, fails to start any container (``setrlimit RLIMIT_NPROC:
Operation not permitted``; with lower limits, ``cgroups in hybrid mode not supported``): runc
with the open-files limit at this process's own and the process limit lowered to 4096 works
(docs/images.md), so that is what runs them.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import ManagedProcess, as_flags
from tests.chart import FULLNAME, REPO, render
from tests.integration.wire import assert_all_completed, http_status, wait_for_rounds, wait_until

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
COORDINATOR = f"localhost/edgefl/coordinator:{VERSION}"
AGENT = f"localhost/edgefl/edge-agent:{VERSION}"
UID = 10001  # the images' USER, the chart's runAsUser
AGENTS = ("phone-0", "phone-1")  # the phone profile trains the tiny MLP
ROUNDS = 2


@pytest.fixture(scope="module")
def images() -> None:
    """Both images, built by the operators' script (a no-op when nothing they are built from changed)."""
    tools = {tool: shutil.which(tool) for tool in ("buildah", "podman", "debootstrap", "runc")}
    if not any(tools.values()):
        pytest.skip("no container tool (buildah, podman) is installed: scripts/test.sh installs them as root")
    missing = [tool for tool, path in tools.items() if path is None]
    assert not missing, f"install {missing} (Debian packages of the same names) to build and run the images"
    done = subprocess.run(["bash", "scripts/build-images.sh", "coordinator", "agent"], cwd=REPO,
                          capture_output=True, text=True, timeout=1700, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stderr)  # what was built and what reused, with timings


def podman_run(name: str, security: dict[str, Any], volumes: dict[Path, str]) -> list[str]:
    """``podman run`` of one container on the host network, with ``security`` (a container
    securityContext of the chart) as podman flags."""
    nofile, nproc = resource.getrlimit(resource.RLIMIT_NOFILE)[1], resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 4096 if nproc == resource.RLIM_INFINITY else min(nproc, 4096)
    argv = ["podman", "run", "--rm", "--name", name, "--runtime", "runc", "--network", "host",
            "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
    if security.get("readOnlyRootFilesystem"):
        argv.append("--read-only")  # and a tmpfs on /tmp, as the chart's emptyDir
    if security.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    argv += [f"--cap-drop={cap.lower()}" for cap in security.get("capabilities", {}).get("drop", [])]
    for host, inside in volumes.items():
        argv += ["--volume", f"{host}:{inside}"]
    return argv


def state_dir(path: Path) -> Path:
    """A host folder the images' user owns, for a container's state volume."""
    path.mkdir(parents=True)
    shutil.chown(path, UID, UID)
    return path


class Run:
    """What tests.integration.wire.wait_for_rounds reads of a fleet: the coordinator and its round log."""

    def __init__(self, coordinator: ManagedProcess, rounds_path: Path) -> None:
        self.coordinator = coordinator
        self.rounds_path = rounds_path


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of the containers a test starts; whatever is left of them is removed after it."""
    names: list[str] = []
    yield names
    for name in names:
        subprocess.run(["podman", "rm", "--force", "--ignore", name], capture_output=True, timeout=60, check=False)


@pytest.mark.timeout(1800)  # a first build of the agent image (torch) takes minutes
def test_built_images_run_two_rounds_as_the_chart_runs_them(images: None, tmp_path: Path, mosquitto: MosquittoBroker,
                                                             containers: list[str]) -> None:
    rendered = render({})
    pod = rendered.get("Deployment", FULLNAME)["spec"]["template"]["spec"]
    chart_container = next(c for c in pod["containers"] if c["name"] == "coordinator")
    # The chart installs what the script built: docker.io/edgefl/coordinator:<version> once loaded.
    assert chart_container["image"] == COORDINATOR.removeprefix("localhost/")
    probes = {chart_container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"/healthz", "/readyz"}
    security = chart_container["securityContext"]
    user = subprocess.run(["podman", "image", "inspect", "--format", "{{.Config.User}}", COORDINATOR],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"

    suffix = uuid.uuid4().hex[:8]
    coordinator_state = state_dir(tmp_path / "coordinator")
    run_coordinator = podman_run(f"edgefl-coordinator-{suffix}", security, {coordinator_state: "/var/lib/edgefl"})
    containers.append(f"edgefl-coordinator-{suffix}")
    enrolled = subprocess.run([*run_coordinator, COORDINATOR, "enroll", *AGENTS, "--state-dir", "/var/lib/edgefl/state",
                               "--bundle-dir", "/var/lib/edgefl/bundles"],
                              capture_output=True, text=True, timeout=120, check=False)
    assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr

    http_port = free_port()
    settings = {"federation": "images", "broker_url": mosquitto.url, "rounds": ROUNDS, "task": "digits",
                "min_available_agents": len(AGENTS), "min_fit_agents": len(AGENTS), "local_epochs": 1,
                "http_host": "127.0.0.1", "http_port": http_port, "exit_when_finished": True}
    coordinator = ManagedProcess("coordinator", [*run_coordinator, COORDINATOR, "run", *as_flags(settings)],
                                 tmp_path / "coordinator.log")
    agents = []
    for i, agent_id in enumerate(AGENTS):
        name = f"edgefl-{agent_id}-{suffix}"
        containers.append(name)
        flags = {"federation": "images", "broker_url": mosquitto.url, "device": "phone", "agent_id": agent_id,
                 "task": "digits", "partition": "iid", "num_partitions": len(AGENTS), "partition_index": i,
                 "threads": 1, "exit_when_finished": True,
                 "signing_key_file": "/var/lib/edgefl-agent/agent_key.pem",
                 "coordinator_key": "/var/lib/edgefl-agent/coordinator.pub"}
        # The enrollment bundle (written by the coordinator container, so owned by the images' user)
        # is the agent's volume; its state goes in a folder inside it.
        bundle = {coordinator_state / "bundles" / agent_id: "/var/lib/edgefl-agent"}
        agents.append(ManagedProcess(agent_id, [*podman_run(name, security, bundle), "--env", "OMP_NUM_THREADS=1",
                                                AGENT, "run", *as_flags(flags)], tmp_path / f"{agent_id}.log"))
    try:
        coordinator.start()
        for path in sorted(probes):
            wait_until(lambda p=path: http_status(f"http://127.0.0.1:{http_port}{p}") == 200, 120,
                       f"the coordinator container's {path}")
        for agent in agents:
            agent.start()
        rounds = wait_for_rounds(Run(coordinator, coordinator_state / "state" / "rounds.jsonl"), ROUNDS + 1, 600)
        assert_all_completed(rounds, ROUNDS + 1)
        assert [r["task"] for r in rounds] == ["train"] * ROUNDS + ["evaluate"], rounds
        assert [r["answered"] for r in rounds] == [len(AGENTS)] * (ROUNDS + 1), rounds  # both agent containers
        for process in (*agents, coordinator):
            assert process.wait(120) == 0, f"{process.name} exited with {process.returncode}:\n{process.log_tail(40)}"
    finally:
        for process in (*agents, coordinator):
            process.terminate()
    for r in rounds:
        print({k: r.get(k) for k in ("round", "task", "outcome", "answered", "duration_s", "train_loss", "accuracy")})
