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

``EDGEFL_COORDINATOR_ARCH=arm64`` and ``EDGEFL_AGENT_ARCH=arm64`` build and run that image for
arm64 instead (another architecture than the host's), under qemu's binfmt handler on an x86-64
host: the checks docs/images.md reports. Agents from an arm64 image are ``rpi`` agents (the
small CNN). The default run builds both for the host.
"""

from __future__ import annotations

import os
import platform
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
COORDINATOR_ARCH = os.environ.get("EDGEFL_COORDINATOR_ARCH", "")
AGENT_ARCH = os.environ.get("EDGEFL_AGENT_ARCH", "")
"""Empty: the host's architecture. Another one's images carry it in their tags (scripts/build-images.sh)."""
COORDINATOR = f"localhost/edgefl/coordinator:{VERSION}{f'-{COORDINATOR_ARCH}' if COORDINATOR_ARCH else ''}"
AGENT = f"localhost/edgefl/edge-agent:{VERSION}{f'-{AGENT_ARCH}' if AGENT_ARCH else ''}"
EMULATED = bool(COORDINATOR_ARCH or AGENT_ARCH)
UID = 10001  # the images' USER, the chart's runAsUser
DEVICE = "rpi" if AGENT_ARCH == "arm64" else "phone"  # the phone profile trains the tiny MLP, rpi the small CNN
AGENTS = (f"{DEVICE}-0", f"{DEVICE}-1")
ROUNDS = 2


@pytest.fixture(scope="module")
def images() -> None:
    """Both images, built by the operators' script (a no-op when nothing they are built from changed)."""
    tools = {tool: shutil.which(tool) for tool in ("buildah", "podman", "debootstrap", "runc")}
    if not any(tools.values()):
        pytest.skip("no container tool (buildah, podman) is installed: scripts/test.sh installs them as root")
    missing = [tool for tool, path in tools.items() if path is None]
    assert not missing, f"install {missing} (Debian packages of the same names) to build and run the images"
    for image, arch in (("coordinator", COORDINATOR_ARCH), ("agent", AGENT_ARCH)):
        done = subprocess.run(["bash", "scripts/build-images.sh", *(["--arch", arch] if arch else []), image],
                              cwd=REPO, capture_output=True, text=True, timeout=3500, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        print(done.stderr)  # what was built and what reused, with timings


def podman_run(name: str, security: dict[str, Any], volumes: dict[Path, str], arch: str = "") -> list[str]:
    """``podman run`` of one container on the host network, with ``security`` (a container
    securityContext of the chart) as podman flags; ``arch``: the image's, when not the host's."""
    nofile, nproc = resource.getrlimit(resource.RLIMIT_NOFILE)[1], resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 4096 if nproc == resource.RLIM_INFINITY else min(nproc, 4096)
    argv = ["podman", "run", "--rm", "--name", name, "--runtime", "runc", "--network", "host",
            *(["--arch", arch] if arch else []),
            "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
    if security.get("readOnlyRootFilesystem"):
        argv.append("--read-only")  # and a tmpfs on /tmp, as the chart's emptyDir
    if security.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    argv += [f"--cap-drop={cap.lower()}" for cap in security.get("capabilities", {}).get("drop", [])]
    for host, inside in volumes.items():
        argv += ["--volume", f"{host}:{inside}"]
    return argv


MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}


def assert_runs_as(image: str, arch: str) -> None:
    """The image's programs run as ``arch``'s (under emulation when it is not the host's), or the host's."""
    done = subprocess.run([*podman_run(f"edgefl-machine-{uuid.uuid4().hex[:8]}", {}, {}, arch), "--entrypoint",
                           "python", image, "-c", "import platform; print(platform.machine())"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (MACHINES[arch] if arch else platform.machine()), (image, done.stdout)


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


@pytest.mark.timeout(7200 if EMULATED else 1800)  # a first build of the agent image (torch) takes minutes
def test_built_images_run_two_rounds_as_the_chart_runs_them(images: None, tmp_path: Path, mosquitto: MosquittoBroker,
                                                             containers: list[str]) -> None:
    rendered = render({})
    pod = rendered.get("Deployment", FULLNAME)["spec"]["template"]["spec"]
    chart_container = next(c for c in pod["containers"] if c["name"] == "coordinator")
    # The chart installs what the script built: docker.io/edgefl/coordinator:<version> once loaded.
    assert chart_container["image"] == f"edgefl/coordinator:{VERSION}"
    probes = {chart_container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"/healthz", "/readyz"}
    security = chart_container["securityContext"]
    user = subprocess.run(["podman", "image", "inspect", "--format", "{{.Config.User}}", COORDINATOR],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"

    assert_runs_as(COORDINATOR, COORDINATOR_ARCH)
    assert_runs_as(AGENT, AGENT_ARCH)
    suffix = uuid.uuid4().hex[:8]
    coordinator_state = state_dir(tmp_path / "coordinator")
    run_coordinator = podman_run(f"edgefl-coordinator-{suffix}", security, {coordinator_state: "/var/lib/edgefl"},
                                 COORDINATOR_ARCH)
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
        flags = {"federation": "images", "broker_url": mosquitto.url, "device": DEVICE, "agent_id": agent_id,
                 "task": "digits", "partition": "iid", "num_partitions": len(AGENTS), "partition_index": i,
                 "threads": 1, "exit_when_finished": True,
                 "signing_key_file": "/var/lib/edgefl-agent/agent_key.pem",
                 "coordinator_key": "/var/lib/edgefl-agent/coordinator.pub"}
        # The enrollment bundle (written by the coordinator container, so owned by the images' user)
        # is the agent's volume; its state goes in a folder inside it.
        bundle = {coordinator_state / "bundles" / agent_id: "/var/lib/edgefl-agent"}
        agents.append(ManagedProcess(agent_id, [*podman_run(name, security, bundle, AGENT_ARCH), "--env", "OMP_NUM_THREADS=1",
                                                AGENT, "run", *as_flags(flags)], tmp_path / f"{agent_id}.log"))
    try:
        coordinator.start()
        for path in sorted(probes):
            wait_until(lambda p=path: http_status(f"http://127.0.0.1:{http_port}{p}") == 200, 120,
                       f"the coordinator container's {path}")
        for agent in agents:
            agent.start()
        rounds = wait_for_rounds(Run(coordinator, coordinator_state / "state" / "rounds.jsonl"), ROUNDS + 1,
                                 1800 if EMULATED else 600)
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
