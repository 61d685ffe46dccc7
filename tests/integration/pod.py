"""Run a pod of the rendered Helm chart as local processes, as close to the manifest as a
machine without Kubernetes allows.

Each volume becomes a directory: configMap and secret volumes hold the rendered files
(``items`` respected), emptyDir and persistentVolumeClaim volumes start empty. Paths that
begin with a mount path, in the command, the arguments and the ConfigMap files, are rewritten
to that directory; ``rewrite`` adds the test's own substitutions (a Service's host:port
becomes 127.0.0.1 and a free port). The environment is the container's own, resolved from
the rendered Secrets, plus PATH and PYTHONPATH; the executable is looked up next to this
Python first (the venv's ``coordinator``), then on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.chart import Rendered

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LocalPod:
    def __init__(self, rendered: Rendered, pod_spec: dict[str, Any], root: Path, *,
                 rewrite: dict[str, str] | None = None, append: dict[str, str] | None = None) -> None:
        self.rendered = rendered
        self.spec = pod_spec
        self.root = root
        self.rewrite = dict(rewrite or {})
        self.append = dict(append or {})
        self.processes: list[subprocess.Popen[bytes]] = []
        root.mkdir(parents=True, exist_ok=True)
        containers = self.spec["containers"] + self.spec.get("initContainers", [])
        self.mounts: dict[str, Path] = {}
        for c in containers:
            for mount in c.get("volumeMounts", []):
                self.mounts[mount["mountPath"]] = self.volume(mount["name"])
        for volume in self.spec.get("volumes", []):
            self._materialize(volume)

    # -- volumes ---------------------------------------------------------------------------
    def volume(self, name: str) -> Path:
        return self.root / "volumes" / name

    def _materialize(self, volume: dict[str, Any]) -> None:
        target = self.volume(volume["name"])
        target.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            data = self.rendered.get("ConfigMap", volume["configMap"]["name"])["data"]
            files = {k: self.localize(v) + self.append.get(k, "") for k, v in data.items()}
        elif "secret" in volume:
            name = volume["secret"]["secretName"]
            files = {k: self.rendered.secret_value(name, k) for k in self._secret_keys(name)}
        else:
            return  # emptyDir, persistentVolumeClaim: an empty directory
        items = volume.get("configMap", volume.get("secret", {})).get("items")
        if items:
            files = {item["path"]: files[item["key"]] for item in items}
        for name, text in files.items():
            (target / name).write_text(text)

    def _secret_keys(self, name: str) -> list[str]:
        secret = self.rendered.get("Secret", name)
        return list(secret.get("data", {})) + list(secret.get("stringData", {}))

    def localize(self, text: str) -> str:
        for old, new in self.rewrite.items():
            text = text.replace(old, new)
        if not self.mounts:
            return text
        # One pass, whole path components only: /tmp must not match inside /tmp/pytest-.../x.
        paths = "|".join(re.escape(p) for p in sorted(self.mounts, key=len, reverse=True))
        pattern = re.compile(rf"(?<![\w./-])({paths})(?=/|[^\w.-]|$)")
        return pattern.sub(lambda match: str(self.mounts[match.group(1)]), text)

    # -- processes -------------------------------------------------------------------------
    def container(self, name: str) -> dict[str, Any]:
        for c in self.spec["containers"] + self.spec.get("initContainers", []):
            if c["name"] == name:
                return c
        raise KeyError(name)

    def env(self, name: str) -> dict[str, str]:
        env = {"PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}", "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
               "LANG": "C.UTF-8"}
        for var in self.container(name).get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                ref = var["valueFrom"]["secretKeyRef"]
                env[var["name"]] = self.rendered.secret_value(ref["name"], ref["key"])
        return env

    def argv(self, name: str) -> list[str]:
        c = self.container(name)
        command = [self.localize(part) for part in c["command"] + c.get("args", [])]
        executable = Path(sys.executable).parent / command[0]
        found = str(executable) if executable.exists() else shutil.which(command[0], path=SYSTEM_PATH)
        assert found, f"{command[0]} is not installed"
        return [found, *command[1:]]

    def run(self, name: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a container to completion (an init container, a test hook)."""
        return subprocess.run(self.argv(name), env=self.env(name), cwd=self.root, capture_output=True, text=True,
                              timeout=timeout_s, check=False)

    def run_init_containers(self) -> None:
        for c in self.spec.get("initContainers", []):
            result = self.run(c["name"])
            assert result.returncode == 0, f"init container {c['name']}: {result.stdout}{result.stderr}"

    def start(self, name: str) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        process = subprocess.Popen(self.argv(name), env=self.env(name), cwd=self.root, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(5)
