"""/metrics, /healthz and /readyz over HTTP, on a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from service_kit.startup import CannotStart

Check = Callable[[], tuple[bool, str]]


class HealthServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, healthy: Check, ready: Check) -> None:
        handler = _handler(registry, healthy, ready)
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:  # a port in use, an address not of this host
            raise CannotStart(f"cannot serve /metrics on {host}:{port} (http_host, http_port): "
                              f"{exc.strerror or exc}") from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and free the port; also for a server never started (``shutdown`` alone would wait forever)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


def _handler(registry: CollectorRegistry, healthy: Check, ready: Check) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/readyz"):
                ok, why = (healthy if path == "/healthz" else ready)()
                self._send(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: stay quiet
            return

    return Handler
