"""Identities that fail loudly, over a real Mosquitto with mTLS, use_identity_as_username and an ACL.

* An agent started under another id than its certificate's CN refuses to start, naming both:
  the broker would know it by the CN and refuse everything it publishes under its own id.
* An agent whose updates the ACL refuses sees each refusal over MQTT 5 (PUBACK 0x87), logs the
  first with its reason code, reports the count in its status (the coordinator exports it as
  ``fl_agents_denied`` and names it in its waiting line), and exits with status 3 after
  ``max_broker_denials`` refusals instead of training for nothing.

Real processes throughout (the coordinator and agents of ``launcher.fleet``); every wait is for a
condition, with a generous bound.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker, free_port
from launcher.fleet import AgentSpec, Fleet, FleetSpec
from tests.integration.test_tls_identity import FEDERATION, Pki, pinned_acl, url
from tests.integration.wire import metric, scrape, wait_until
from tests.tls import mtls_listener

pytestmark = pytest.mark.integration

ALLOWED, DENIED = "rpi-1", "phone-0"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def acl_without_updates_of(agent_id: str) -> str:
    """The shipped ACL, except that only the other agents may write their updates."""
    updates = f"pattern write fl/{FEDERATION}/updates/%c/#\n"
    acl = pinned_acl(FEDERATION)
    assert updates in acl
    others = "".join(f"\nuser {name}\ntopic write fl/{FEDERATION}/updates/{name}/#\n"
                     for name in (ALLOWED, "agent-a", "agent-b") if name != agent_id)
    return acl.replace(updates, "") + others


@pytest.fixture
def broker(tmp_path: Path, pki: Pki) -> Iterator[MosquittoBroker]:
    acl = tmp_path / "acl"
    acl.write_text(acl_without_updates_of(DENIED))
    port = free_port()
    settings = mtls_listener(port, pki.ca, pki.server, acl)
    with MosquittoBroker(port, workdir=tmp_path / "broker", settings=settings) as running:
        yield running


def tls(pki: Pki, name: str) -> dict[str, str]:
    issued = pki.clients[name]
    return {"ca_file": str(pki.ca.cert_file), "cert_file": str(issued.cert_file), "key_file": str(issued.key_file)}


def test_an_agent_with_another_agents_certificate_refuses_to_start(tmp_path: Path, broker: MosquittoBroker,
                                                                   pki: Pki) -> None:
    flags = {"broker_url": url(broker, host="localhost"), "federation": FEDERATION, "agent_id": DENIED,
             "device": "phone", "state_dir": str(tmp_path / "agent"), **tls(pki, ALLOWED)}
    argv = [sys.executable, "-m", "edge_agent", "run"]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert f"agent id '{DENIED}' is not the identity of cert_file" in done.stderr, done.stderr
    assert f"which is '{ALLOWED}'" in done.stderr and "agent_id (--agent-id" in done.stderr
    assert not (tmp_path / "agent" / "agent_id").exists()  # it stopped before touching its state


def test_an_agent_the_acl_refuses_reports_it_and_gives_up(tmp_path: Path, broker: MosquittoBroker, pki: Pki) -> None:
    http_port = free_port()
    agents = [AgentSpec(ALLOWED, "rpi", 0, tls(pki, ALLOWED)),
              AgentSpec(DENIED, "phone", 1, {**tls(pki, DENIED), "max_broker_denials": 2})]
    # Short heartbeats and agent timeout: once the refused agent is gone, the coordinator soon waits for it.
    spec = FleetSpec(agents=agents, alpha=1.0, agent_settings={"heartbeat_s": 1.0})
    fleet = Fleet(tmp_path / "run", url(broker, host="localhost"), spec, {
        "rounds": 50, "min_available_agents": 2, "min_fit_agents": 2, "local_epochs": 1, "round_deadline_s": 8.0,
        "agent_timeout_s": 6.0, "http_port": http_port, **tls(pki, "coordinator"),
    }, federation=FEDERATION)
    denied = fleet.agents[DENIED]
    with fleet:
        # Selected each round, it trains and publishes its update; the broker refuses it each time.
        wait_until(lambda: not denied.running, 240, f"{DENIED} to give up")
        assert denied.returncode == 3, denied.log_tail(30)
        log = denied.log_path.read_text(errors="replace")
        refusal = f"publish to fl/{FEDERATION}/updates/{DENIED}/1 refused: Not authorized (0x87)"
        logged = [line for line in log.splitlines() if "protocol.transport.mqtt" in line and "refused:" in line]
        assert len(logged) == 1 and refusal in logged[0], log  # the first refusal, logged once
        assert f"the broker refused 2 publishes or subscriptions of agent {DENIED}" in log, log
        # Its statuses carried the count: the coordinator exports it and says why it waits.
        wait_until(lambda: metric(scrape(http_port), "fl_agents_denied", device="phone") == 1, 60,
                   "the coordinator to count the refused agent")
        assert metric(scrape(http_port), "fl_agents_denied", device="rpi") == 0
        waiting = re.compile(rf"waiting for agents: 1 online, 2 needed; not available: {DENIED} "
                             rf"\((silent|offline), broker refused [12]\)")
        wait_until(lambda: waiting.search(fleet.coordinator.log_path.read_text(errors="replace")) is not None, 60,
                   "the coordinator to name the agent it waits for")
        assert fleet.agents[ALLOWED].running and fleet.coordinator.running
        coordinator_log = fleet.coordinator.log_path.read_text(errors="replace")
        assert "refused:" not in coordinator_log, coordinator_log  # nothing of the coordinator's was refused
        assert metric(scrape(http_port), "fl_broker_denials_total", action="publish") == 0
