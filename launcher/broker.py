"""MQTT brokers for one machine: an embedded amqtt broker, or a real Mosquitto process.

Both listen on 127.0.0.1 on a free port and expose ``url`` for the ``--broker-url`` flags.

amqtt 0.12 notes (checked with ``python -m launcher.brokercheck``):
* retained messages, clearing them with an empty payload, QoS 1, multi-MB payloads and
  last wills work with paho-mqtt 2.x clients;
* on every CONNECT it also replays, at QoS 0, the retained messages matching *any* client's
  subscriptions (not just the new client's); our clients parse every topic and ignore kinds
  they did not ask for, so this only costs bytes;
* it keeps everything in memory and is single-threaded Python: fine for a demo fleet,
  not for load tests (use Mosquitto there);
* it speaks MQTT 3.1.1 only: it answers an MQTT 5 CONNECT with "unacceptable protocol version",
  except one that carries a last will, which it never answers (its parser waits for bytes that
  do not come), so clients of it are configured with ``mqtt_version`` 3.1.1 (``mqtt_version``
  below), and a refused publish cannot be seen by them;
* it walks its subscription table across awaits, so clients connecting or leaving together could
  fail one another's admission or a delivery: ``amqtt_table.py`` makes those walks iterate snapshots.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TypeVar

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MOSQUITTO_FALLBACK = Path("/usr/sbin/mosquitto")
"""Where Debian's package puts the binary: /usr/sbin is not on every user's PATH."""

_Broker = TypeVar("_Broker", bound="LocalBroker")


def mosquitto_binary() -> str | None:
    """The ``mosquitto`` executable: on PATH, or Debian's /usr/sbin/mosquitto; None if neither."""
    return shutil.which("mosquitto") or (str(MOSQUITTO_FALLBACK) if MOSQUITTO_FALLBACK.exists() else None)


PORTS_FROM = 20000
"""Lowest port ``free_port`` picks (where the kernel's ephemeral range leaves room below it)."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low() -> int | None:
    """The first port of the range the kernel gives outgoing connections (Linux), or None where unknown."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(host: str = HOST) -> int:
    """A TCP port nothing is bound to right now, below the kernel's ephemeral range where it can be.

    A port the OS picks (bind to port 0) is an ephemeral one, which the kernel may also give any outgoing
    connection as its source port. A broker restarted on its port (the chaos tests) stays down for seconds; had
    another process's connection taken the port meanwhile, the broker could not bind it again until that connection
    closed (seen once in CI: a restart failed for 10 s with "Address already in use"). Below the range, no
    connection is ever given it.
    """
    low = ephemeral_low()
    if low is not None and low - PORTS_FROM >= 1000:
        for port in random.sample(range(PORTS_FROM, low), 64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """True once ``host:port`` accepts a TCP connection, False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class BrokerError(RuntimeError):
    """A broker could not be started."""


class LocalBroker:
    """A broker this process started on 127.0.0.1; ``url`` is what clients connect to."""

    host = HOST
    port = 0
    mqtt_version = "auto"
    """What clients of this broker set as their mqtt_version setting."""

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def start(self) -> LocalBroker:  # pragma: no cover - overridden
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self: _Broker) -> _Broker:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class EmbeddedBroker(LocalBroker):
    """A pure-Python amqtt broker on its own asyncio loop in a daemon thread."""

    name = "amqtt (embedded)"
    mqtt_version = "3.1.1"  # see the module's notes

    def __init__(self, port: int = 0, *, quiet: bool = True) -> None:
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._broker: object | None = None
        if quiet:  # amqtt logs every connection at INFO
            logging.getLogger("amqtt").setLevel(logging.WARNING)
            logging.getLogger("transitions").setLevel(logging.WARNING)

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="amqtt-broker", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise BrokerError(f"amqtt broker did not start within {timeout_s:.0f}s")
        if failure:
            raise BrokerError(f"amqtt broker failed to start: {failure[0]}") from failure[0]
        # No TCP probe here: the listener is bound once start() returned, and amqtt logs an error
        # for every connection that closes before sending CONNECT.
        log.info("embedded amqtt broker on %s", self.url)
        return self

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        from amqtt.broker import Broker

        from launcher.amqtt_table import make_walks_safe

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        config = {
            # Port 0: the OS picks a free port at bind time, so there is no race with other processes.
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}", "max_connections": 0}},
            # Only anonymous auth: the default packet/event loggers and $SYS plugin cost CPU for nothing.
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }
        try:
            broker = Broker(config, loop=loop)
            make_walks_safe(broker)
            loop.run_until_complete(broker.start())
            server = broker._servers["default"].instance  # the bound asyncio.Server (no public accessor)
            self.port = int(server.sockets[0].getsockname()[1])
            self._broker = broker
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            failure.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, broker = self._loop, self._broker
        if loop is None or broker is None or self._thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(broker.shutdown(), loop).result(timeout_s)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - stopping anyway
            log.warning("amqtt shutdown: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout_s)
        self._broker = None
        self._loop = None


class MosquittoBroker(LocalBroker):
    """The real ``mosquitto`` binary with a generated config, on a free port that survives restarts."""

    name = "mosquitto"

    def __init__(self, port: int | None = None, *, persistence: bool = False, workdir: Path | None = None,
                 binary: str | None = None, max_packet_bytes: int = 0, settings: str = "") -> None:
        """``settings``: extra mosquitto.conf lines (e.g. a rendered config's limits); an option
        named there replaces every generated line of that option."""
        found = binary or mosquitto_binary()
        if found is None:
            raise BrokerError("the mosquitto binary is not installed (apt-get install mosquitto); "
                              "it is needed for this broker")
        self.binary = found
        self.port = port or free_port()
        self.persistence = persistence
        self.max_packet_bytes = max_packet_bytes
        self.settings = settings
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fl-mosquitto-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None

    def _write_config(self) -> Path:
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            # Started as root, mosquitto would drop to user 'mosquitto' and fail to write its
            # persistence file in our directory; naming the current user keeps it as is.
            f"user {getpass.getuser()}",
            f"persistence {'true' if self.persistence else 'false'}",
            f"persistence_location {self.workdir}/",
            "autosave_interval 1",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "log_type notice",
            # Unbounded queues: a slow agent must not lose QoS 1 global states mid-demo.
            "max_queued_messages 0",
            "max_inflight_messages 0",
            "set_tcp_nodelay true",
        ]
        if self.max_packet_bytes:
            lines.append(f"max_packet_size {self.max_packet_bytes}")
        extra = [line.strip() for line in self.settings.splitlines()]
        extra = [line for line in extra if line and not line.startswith("#")]
        if extra:
            replaced = {line.split()[0] for line in extra}
            lines = [line for line in lines if line.split()[0] not in replaced] + extra
        path = self.workdir / "mosquitto.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The running broker's process id (benches read its CPU time from /proc), or None."""
        return self._process.pid if self.running and self._process is not None else None

    def start(self, timeout_s: float = 10.0) -> MosquittoBroker:
        config = self._write_config()
        log_file = self.log_path.open("ab")
        self._process = subprocess.Popen([self.binary, "-c", str(config)], stdout=log_file, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        log_file.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerError(f"mosquitto exited with {self._process.returncode} at start; "
                                  f"see {self.log_path}:\n{self._tail()}")
            if wait_for_port(self.host, self.port, 0.2):
                log.info("mosquitto (pid %d) on %s", self._process.pid, self.url)
                return self
        self.stop()
        raise BrokerError(f"mosquitto did not accept connections on port {self.port} within {timeout_s:.0f}s")

    def _tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()  # SIGTERM: mosquitto saves its persistence file on the way out
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)

    def restart(self, timeout_s: float = 10.0, *, down_s: float = 0.0) -> MosquittoBroker:
        """Stop, stay down ``down_s`` seconds, and start on the same port (clients reconnect to the same URL)."""
        self.stop()
        time.sleep(down_s)
        deadline = time.monotonic() + timeout_s
        while True:  # the port may linger in TIME_WAIT briefly; mosquitto sets SO_REUSEADDR, so this is short
            try:
                return self.start(timeout_s)
            except BrokerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def cleanup(self) -> None:
        """Stop, and remove the work directory if this broker made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
