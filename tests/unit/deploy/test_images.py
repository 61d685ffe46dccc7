"""What can be checked of the container images without a container engine.

No image is built here (there is no Docker on the test machines). Instead: the coordinator
image's pinned requirements are exactly the project's core dependencies and what they pull
in (no torch), and the coordinator imports and serves its metrics with nothing else
importable; the Dockerfiles copy only paths the build context keeps, and run as the user the
Helm chart's securityContext expects.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata

import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from tests.chart import CHART, REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DEPLOY = REPO / "deploy"
DOCKERFILES = sorted(DEPLOY.glob("*/Dockerfile*"))
REQUIREMENTS = DEPLOY / "coordinator" / "requirements.txt"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def core_closure() -> set[str]:
    """The core dependencies and, recursively, theirs (as installed here), without extras."""
    seen: set[str] = set()
    todo = core_requirements()
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if normalize(req.name) in seen:
            continue
        seen.add(normalize(req.name))
        todo += [Requirement(r) for r in metadata.distribution(req.name).requires or []]
    return seen


def pinned() -> dict[str, Version]:
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[normalize(name)] = Version(version)
    return pins


def test_coordinator_requirements_pin_exactly_the_core_dependencies() -> None:
    pins = pinned()
    closure = core_closure()
    assert set(pins) == closure, (f"add {sorted(closure - set(pins))}, remove {sorted(set(pins) - closure)} "
                                  f"in {REQUIREMENTS.relative_to(REPO)}")
    assert not {"torch", "opacus", "torchvision", "scikit-learn"} & set(pins)
    for req in core_requirements():
        assert pins[normalize(req.name)] in req.specifier, f"{req.name}=={pins[normalize(req.name)]} vs {req}"


RUNNER = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys, tempfile, urllib.request
    from pathlib import Path

    ALLOWED = set(sys.argv[1].split(","))
    BLOCKED = set(sys.argv[2].split(","))
    PRELOADED = {m.partition(".")[0] for m in sys.modules}  # by .pth files at start-up (setuptools' hack)

    class OnlyTheImage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in BLOCKED and top not in ALLOWED:
                raise ModuleNotFoundError(f"No module named {name!r} (not in the coordinator image)", name=name)
            return None

    sys.meta_path.insert(0, OnlyTheImage())
    for package in ("protocol", "service_kit", "coordinator"):
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)

    from prometheus_client import CollectorRegistry
    from coordinator.settings import CoordinatorSettings
    from coordinator.app.service import CoordinatorService

    with tempfile.TemporaryDirectory() as state:
        service = CoordinatorService(CoordinatorSettings(http_host="127.0.0.1", http_port=0, state_dir=Path(state)),
                                     registry=CollectorRegistry())
        service.driver.restore()
        service.http.start()
        body = urllib.request.urlopen(f"http://127.0.0.1:{service.http.port}/metrics", timeout=10).read().decode()
        service.http.stop()
    assert "fl_rounds_total" in body
    import contextlib, io
    from coordinator.app.cli import app  # typer without Rich (TYPER_USE_RICH=0): a bad setting still names its field
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        try:
            app(["run", "--rounds", "0"])
        except SystemExit as exc:
            code = exc.code
        else:
            code = "no exit"
    assert code == 2 and "rounds (--rounds" in said.getvalue(), (code, said.getvalue())
    leaked = sorted({m.partition(".")[0] for m in sys.modules} & BLOCKED - ALLOWED - PRELOADED)
    assert not leaked, leaked
    print("coordinator served /metrics with only the image's packages")
    """
)


DROPPED = {"rich", "pygments", "markdown-it-py", "mdurl"}
"""Pinned (typer requires Rich) but uninstalled by the coordinator's Dockerfile: typer's optional formatting."""


def test_the_dockerfile_drops_exactly_richs_tree_and_turns_typers_rich_off() -> None:
    dockerfile = (DEPLOY / "coordinator" / "Dockerfile").read_text()
    uninstalls = re.findall(r"pip uninstall --yes --quiet ([a-z0-9 _.-]+?) \\", dockerfile)
    assert {normalize(n) for n in uninstalls[0].split()} == DROPPED, uninstalls
    assert DROPPED <= set(pinned())
    assert "TYPER_USE_RICH=0" in dockerfile.partition("\nFROM ${PYTHON_IMAGE}\n")[2]  # in the runtime stage's ENV


def test_coordinator_runs_with_only_the_image_packages() -> None:
    """Every installed distribution outside the pinned set, and the pinned ones the Dockerfile drops, are
    unimportable, torch included."""
    closure = core_closure() - DROPPED
    owners = metadata.packages_distributions()
    allowed = {"protocol", "service_kit", "coordinator"} | {m for m, dists in owners.items()
                                                            if {normalize(d) for d in dists} & closure}
    blocked = {m for m in owners if m not in allowed} | {"edge_agent", "launcher", "tests", "bench"}
    assert {"torch", "opacus", "sklearn", "amqtt"} <= blocked
    assert {"rich", "pygments", "markdown_it"} <= blocked
    result = subprocess.run([sys.executable, "-c", RUNNER, ",".join(sorted(allowed)), ",".join(sorted(blocked))],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "TYPER_USE_RICH": "0"})
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "only the image's packages" in result.stdout


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_dockerfiles_copy_only_what_the_build_context_keeps() -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert {p.name for p in DOCKERFILES} == {"Dockerfile", "Dockerfile.jetson"} and len(DOCKERFILES) == 3
    for dockerfile in DOCKERFILES:
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    assert (REPO / source).exists(), f"{dockerfile.name}: {source} does not exist"
                    assert not _ignored(source, patterns), f"{dockerfile.name}: {source} is in .dockerignore"


def test_images_run_as_the_user_the_chart_expects() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    uid = values["coordinator"]["podSecurityContext"]["runAsUser"]
    for dockerfile in DOCKERFILES:
        users = re.findall(r"^USER (\S+)$", dockerfile.read_text(), flags=re.MULTILINE)
        assert users == [f"{uid}:{uid}"], (dockerfile, users)  # numeric: runAsNonRoot can verify it


def test_only_the_agent_images_install_torch() -> None:
    coordinator = (DEPLOY / "coordinator" / "Dockerfile").read_text()
    commands = [line for line in coordinator.splitlines() if "torch" in line and not line.startswith("#")]
    assert all("find_spec('torch') is None" in line for line in commands), commands
    assert "COPY edge_agent" not in coordinator and ".[" not in coordinator
    assert "-r /tmp/requirements.txt" in coordinator and "--no-deps ." in coordinator
    for name in ("Dockerfile", "Dockerfile.jetson"):
        agent = (DEPLOY / "edge-agent" / name).read_text()
        assert 'pip install ".[agent]"' in agent and "COPY coordinator" not in agent
    assert re.search(r"^ARG L4T_IMAGE=nvcr\.io/nvidia/l4t-", (DEPLOY / "edge-agent" / "Dockerfile.jetson").read_text(),
                     flags=re.MULTILINE)


def test_the_chart_installs_the_tags_the_build_script_makes() -> None:
    """scripts/build-images.sh tags edgefl/<image>:<pyproject version>; the chart's default image
    (repository, tag defaulting to appVersion) and the k3s DaemonSet name the same."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    assert (image["repository"], image["tag"] or chart["appVersion"]) == ("edgefl/coordinator", version)
    script = (REPO / "scripts" / "build-images.sh").read_text()
    assert "PREFIX=edgefl\n" in script and 'ref=localhost/$PREFIX/$name:$VERSION' in script
    assert "build coordinator deploy/coordinator/Dockerfile" in script
    assert "build edge-agent deploy/edge-agent/Dockerfile" in script
    assert f"image: edgefl/edge-agent:{version}" in (DEPLOY / "k3s" / "edge-agent-daemonset.yaml").read_text()
    # the tarballs carry the name a kubelet resolves edgefl/coordinator:<tag> to; only another architecture's
    # images have a suffix (-arm64 built on x86-64), so the host's are the chart's default tag
    assert '"docker-archive:$out:docker.io/$PREFIX/$name:$VERSION$suffix"' in script
    assert re.search(r'^suffix=""\nif \[ "\$arch" != "\$host_arch" \]; then\n  suffix=-\$arch$', script, re.MULTILINE)


def test_the_build_script_names_the_architectures_it_builds_for() -> None:
    """An architecture it cannot build for stops it before anything is built, saying which it can."""
    script = REPO / "scripts" / "build-images.sh"
    done = subprocess.run(["bash", str(script), "--arch", "riscv64", "agent"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert (done.returncode, done.stderr.strip()) == (2, "error: --arch riscv64: amd64 or arm64")
    usage = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "--arch arm64 agent" in usage.stdout and "qemu-user-static" in usage.stdout


def test_the_jetson_image_pins_the_torch_it_ships() -> None:
    """From a third party's index, an unpinned torch is whatever it serves on build day (found in review): the build
    names the version, and fails without one."""
    text = (DEPLOY / "edge-agent" / "Dockerfile.jetson").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and "torch" in line]
    assert installs and all('"torch==${TORCH_VERSION}"' in line for line in installs)
    assert re.search(r'^RUN test -n "\$\{TORCH_VERSION\}" \|\|', text, re.MULTILINE)
