"""A site broker as the site chart renders it, bridged to the compose lab's root broker: real Mosquittos.

The root broker runs the lab's config with the password file and ACL that start-broker.sh writes
(deploy/mosquitto/acl plus a block for the site's bridge user); the site broker runs the chart's
rendered pod (its init container builds the password file and the bridge's file, tests/integration/pod.py).
What goes down, what goes up and what stays at the site is seen by subscribers on both sides. Denied or
unbridged QoS 1 publishes vanish silently, so each check ends with a publish that does cross, from the
same client: one client's messages arrive in order, so anything let through before it would be seen.
"""

from __future__ import annotations

import getpass
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.broker import free_port, mosquitto_binary, wait_for_port
from tests.chart import REPO
from tests.integration.pod import LocalPod
from tests.integration.test_broker_acl import Broker, Client, run_configured
from tests.integration.wire import WireRecorder, wait_until
from tests.unit.deploy.test_site_chart import FULLNAME, render

pytestmark = pytest.mark.integration

LAB = REPO / "deploy" / "compose" / "mosquitto"
PASSWORD = "lab-password"
F = "fl/default"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Broker]:
    """The lab's root broker: start-broker.sh's password file and ACL (site site1), on a free port."""
    binary = mosquitto_binary()
    assert binary is not None, "the mosquitto binary is not installed (apt-get install mosquitto)"
    data = tmp_path / "root"
    data.mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mosquitto").write_text("#!/bin/sh\nexit 0\n")  # the script's last step; started below instead
    (fake / "mosquitto").chmod(stat.S_IRWXU)
    env = {"PATH": f"{fake}:{os.environ['PATH']}", "LAB_BROKER_PASSWORD": PASSWORD, "LAB_CLIENTS": "coordinator",
           "LAB_SITES": "site1", "MOSQUITTO_PASSWD_FILE": str(data / "passwd"), "MOSQUITTO_ACL_FILE": str(data / "acl"),
           "MOSQUITTO_ACL_BASE": str(REPO / "deploy" / "mosquitto" / "acl")}
    subprocess.run(["sh", str(LAB / "start-broker.sh")], env=env, check=True, timeout=60)
    # Test only: a user that reads everything, to see what crosses into the root broker.
    subprocess.run(["mosquitto_passwd", "-b", str(data / "passwd"), "watcher", PASSWORD], check=True, timeout=30)
    with (data / "acl").open("a") as acl:
        acl.write("\nuser watcher\ntopic read #\n")
    port = free_port()
    yield from run_configured(binary, LAB / "mosquitto.conf", data, port, {})


@pytest.fixture
def site(tmp_path: Path, root: Broker) -> Iterator[Broker]:
    """Site site1's broker from the chart's rendered pod, its bridge pointed at the root broker."""
    rendered = render({
        "siteId": "site1", "root": {"host": "root-broker", "port": 1883, "password": PASSWORD},
        "aggregator": {"password": "aggregator-pw", "credentials": {
            "signingKey": "PEM\n", "coordinatorKey": "ed25519:AAAA", "enrolledAgents": "{}"}},
        "mosquitto": {"agents": [{"username": "rpi-1", "password": "rpi-1-pw"}]},
    })
    port = free_port()
    pod = LocalPod(rendered, rendered.get("Deployment", f"{FULLNAME}-mosquitto")["spec"]["template"]["spec"],
                   tmp_path / "site", rewrite={
                       "listener 1883\n": f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\n",
                       "address root-broker:1883": f"address 127.0.0.1:{root.port}"})
    try:
        pod.run_init_containers()
        bridge = (pod.volume("bridge") / "bridge.conf").read_text()
        assert bridge.endswith(f"remote_password {PASSWORD}\n") and "remote_username site1-bridge" in bridge
        process = pod.start("mosquitto")
        assert wait_for_port("127.0.0.1", port, 10), pod.log("mosquitto")
        yield Broker(port, process, pod.root / "mosquitto.log")
    finally:
        pod.stop()


def url(broker: Broker, user: str, password: str) -> str:
    return f"mqtt://{user}:{password}@127.0.0.1:{broker.port}"


def test_the_bridge_carries_the_root_down_and_the_sites_roster_and_partials_up_and_keeps_updates_and_statuses(
        root: Broker, site: Broker) -> None:
    at_root = WireRecorder(url(root, "watcher", PASSWORD), "fl/#", client_id="watcher").start()
    coordinator = Client(root, "coordinator", PASSWORD, "coordinator")
    agent = Client(site, "rpi-1", "rpi-1-pw", "rpi-1")
    agent.subscribe(f"{F}/#")
    aggregator = Client(site, "site-aggregator", "aggregator-pw", "site-aggregator")
    aggregator.subscribe(f"{F}/#")
    try:
        # Down: the round (retained, so it reaches the site whenever the bridge connects), a notice, a state.
        coordinator.publish(f"{F}/rounds/current", b"round", retain=True)
        wait_until(lambda: f"{F}/rounds/current" in agent.received, 30, "the round, down the bridge")
        coordinator.publish(f"{F}/notices/rpi-1")
        coordinator.publish(f"{F}/sites/site1/resync")  # the root asks the site for statuses: to its aggregator
        coordinator.publish(f"{F}/global/cnn_small/1")
        wait_until(lambda: f"{F}/global/cnn_small/1" in agent.received, 20, "the global state, down")
        wait_until(lambda: f"{F}/sites/site1/resync" in aggregator.received, 20, "the resync request, down")
        assert f"{F}/notices/rpi-1" in agent.received and f"{F}/rounds/current" in aggregator.received
        assert f"{F}/sites/site1/resync" not in agent.received  # an agent reads no site's traffic

        # The agent's update and status stay at the site, where its aggregator reads them.
        agent.publish(f"{F}/updates/rpi-1/1")
        agent.publish(f"{F}/sites/site1/partials/1")  # denied: agents do not speak for the site
        agent.publish(f"{F}/sites/site1/roster")  # denied too
        agent.publish(f"{F}/agents/rpi-1/status")
        wait_until(lambda: f"{F}/agents/rpi-1/status" in aggregator.received, 20, "the status, at the site")
        assert f"{F}/updates/rpi-1/1" in aggregator.received

        # The aggregator's roster and partial go up; either in another site's name, or an announcement, is refused
        # at the site.
        aggregator.publish(f"{F}/sites/site2/partials/1")
        aggregator.publish(f"{F}/sites/site2/roster")
        aggregator.publish(f"{F}/rounds/current", b"forged")
        aggregator.publish(f"{F}/sites/site1/roster", b"roster")
        aggregator.publish(f"{F}/sites/site1/partials/1", b"partial")
        wait_until(lambda: f"{F}/sites/site1/partials/1" in {m.topic for m in at_root.snapshot()}, 20, "partial, up")

        seen_at_root = sorted(m.topic for m in at_root.snapshot() if m.topic != f"{F}/rounds/current")
        assert seen_at_root == sorted([f"{F}/notices/rpi-1", f"{F}/sites/site1/resync", f"{F}/global/cnn_small/1",
                                       f"{F}/sites/site1/roster", f"{F}/sites/site1/partials/1"])
        assert [m.payload for m in at_root.snapshot() if m.topic.endswith("/roster")] == [b"roster"]
        assert [m.payload for m in at_root.snapshot() if "/partials/" in m.topic] == [b"partial"]
        assert [m.payload for m in at_root.snapshot() if m.topic == f"{F}/rounds/current"] == [b"round"]
        assert f"{F}/sites/site1/partials/1" not in agent.received  # an agent reads no partial
    finally:
        for client in (coordinator, agent, aggregator):
            client.close()
        at_root.stop()
