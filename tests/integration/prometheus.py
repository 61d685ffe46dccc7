"""A real Prometheus server (Debian's ``prometheus`` package) for tests, and its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from launcher.broker import free_port
from tests.integration.wire import wait_until


class PrometheusError(AssertionError):
    """The API answered with an error (a bad query, a failed evaluation)."""


class PrometheusServer:
    def __init__(self, workdir: Path, targets: dict[str, list[str]], *, rule_files: list[Path] | None = None,
                 interval_s: int = 1) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).exists():
            raise FileNotFoundError("the prometheus binary is not installed (apt-get install prometheus)")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.log_path = workdir / "prometheus.log"
        self.config = {
            "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s",
                       "scrape_timeout": f"{interval_s}s"},
            "rule_files": [str(p) for p in rule_files or []],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": hosts}]}
                               for job, hosts in targets.items()],
        }
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config))
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(self._ready, timeout_s, f"prometheus on port {self.port}\n{self.log_tail()}")
        return self

    def _ready(self) -> bool:
        assert self._process is not None and self._process.poll() is None, self.log_tail()
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    # -- API -------------------------------------------------------------------------------
    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400/422: the body says why
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        data = self.api("query", **params)
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=start, end=end, step=step_s)["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self.api(f"label/{label}/values", **{"match[]": match}))
