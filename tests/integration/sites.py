"""Test helpers for sites: a site broker bridged to the root broker, and site aggregator processes."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from pathlib import Path

from launcher import sites
from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import Fleet, ManagedProcess, as_flags
from launcher.forked import FORK_BY_DEFAULT
from tests.integration.wire import wait_until


def bridge_settings(root: MosquittoBroker, federation: str, site_id: str = "s1", port: int | None = None) -> str:
    """The launcher's bridge (deploy/mosquitto/site-bridge.conf's topics) to ``root``, through ``port`` if given."""
    return sites.bridge_settings(federation, site_id, root.host, port or root.port)


def enroll_site(fleet: Fleet, site_id: str, bundle_dir: Path) -> None:
    """``coordinator enroll SITE``, as an operator enrolls a site: its key and the root's land in bundle_dir/SITE."""
    done = subprocess.run([sys.executable, "-m", "coordinator", "enroll", site_id, "--state-dir",
                           str(fleet.coordinator_dir), "--bundle-dir", str(bundle_dir)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def site_process(fleet: Fleet, broker: MosquittoBroker, site_id: str, bundle_dir: Path, *, name: str = "site",
                 signing_key_file: Path | None = None, client_id: str | None = None,
                 **settings: object) -> ManagedProcess:
    """``coordinator site`` for ``site_id`` on ``broker``, with the credentials ``enroll_site`` wrote (or
    ``signing_key_file``: another key, created if missing), logging to bundle_dir/NAME.log."""
    flags: dict[str, object] = {
        "federation": fleet.federation, "broker_url": broker.url, "site_id": site_id,
        "state_dir": bundle_dir / f"{name}-state", "enrolled_agents_file": fleet.coordinator_dir / "enrolled.json",
        "signing_key_file": signing_key_file or bundle_dir / site_id / "agent_key.pem",
        "coordinator_key": bundle_dir / site_id / "coordinator.pub", "task": fleet.coordinator_settings["task"],
        "min_available_agents": fleet.coordinator_settings.get("min_available_agents", 1),
        "min_fit_agents": fleet.coordinator_settings.get("min_fit_agents", 1), **settings}
    if client_id is not None:
        flags["client_id"] = client_id
    return ManagedProcess(name, [sys.executable, "-m", "coordinator", "site", *as_flags(flags)],
                          bundle_dir / f"{name}.log", forked=FORK_BY_DEFAULT)


def wait_for_log(process: ManagedProcess, text: str, timeout_s: float, after: int = 0) -> None:
    """Until ``text`` is in the process's log beyond its first ``after`` characters (fails if the process exits)."""
    def seen() -> bool:
        assert process.running or process.returncode is None, process.log_tail(20)
        try:
            return text in process.log_path.read_text()[after:]
        except FileNotFoundError:
            return False
    wait_until(seen, timeout_s, f"{text!r} in {process.name}'s log")


class TcpLink:
    """A TCP forwarder from a local port to ``target``: what a site's uplink is to its bridge. ``cut`` closes every
    connection through it and refuses new ones until ``restore``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._up = threading.Event()
        self._up.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.connections = 0
        """Connections forwarded so far."""
        self._thread = threading.Thread(target=self._accept, name="tcp-link", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            if not self._up.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass  # the other direction closed it, or cut() did
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._up.clear()
        with self._lock:
            sockets, self._open = self._open, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(5)
        self._server.close()
