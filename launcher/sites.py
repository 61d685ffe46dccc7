"""Sites on one machine: a Mosquitto per site, bridged to the root's, the site aggregator's command, and the
demo's sites (``fl-demo --sites N``) with their share of the progress line and the summary.

The bridge's topics are those of ``deploy/mosquitto/site-bridge.conf`` (a test keeps the two alike):
announcements, tasks, global states, notices and the root's resync requests go down; the site's roster of
its agents and its partial aggregates go up; agents' statuses and updates are not bridged and stay at the site.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import paho.mqtt.publish as publish
from rich.table import Table

from coordinator.state.rounds import RoundSummary
from launcher.broker import MosquittoBroker
from launcher.fleet import AgentSpec, Fleet, ManagedProcess, as_flags, run_to_end
from launcher.forked import FORK_BY_DEFAULT
from launcher.progress import human_bytes
from protocol.topics import Topics
from protocol.transport.mqtt import BrokerAddress

DOWN = ("coordinator/status", "rounds/current", "task", "global/#", "notices/#", "sites/+/resync")
"""Topics (under fl/FEDERATION/) the root publishes and the site follows."""
UP = ("sites/+/roster", "sites/+/partials/#")
"""Topics (under fl/FEDERATION/) the site publishes for the root."""


def bridge_topics(federation: str) -> list[str]:
    """The bridge's ``topic`` lines."""
    return [f"topic fl/{federation}/{t} in 1" for t in DOWN] + [f"topic fl/{federation}/{t} out 1" for t in UP]


def bridge_settings(federation: str, site_id: str, root_host: str, root_port: int,
                    restart_timeout: str = "1 5") -> str:
    """mosquitto.conf lines bridging a site broker to the root broker at ``root_host:root_port``. A persistent
    bridge session (``cleansession false``): what crosses while the link is down waits on either side."""
    return "\n".join([
        "connection root", f"address {root_host}:{root_port}", f"remote_clientid site-{site_id}-bridge",
        "cleansession false", "try_private true", f"restart_timeout {restart_timeout}", *bridge_topics(federation),
    ])


def site_broker(workdir: Path, federation: str, site_id: str, root: MosquittoBroker, *,
                root_port: int | None = None, persistence: bool = False) -> MosquittoBroker:
    """A site's Mosquitto (not started), bridged to ``root`` (through ``root_port`` on its host, if given)."""
    return MosquittoBroker(workdir=workdir, persistence=persistence,
                           settings=bridge_settings(federation, site_id, root.host, root_port or root.port))


def site_aggregator(name: str, settings: Mapping[str, Any], log_path: Path,
                    env: Mapping[str, str] | None = None, python: str = sys.executable,
                    forked: bool = FORK_BY_DEFAULT) -> ManagedProcess:
    """``coordinator site`` with ``settings`` as its flags (not started; ``forked`` as ``ManagedProcess``'s)."""
    return ManagedProcess(name, [python, "-m", "coordinator", "site", *as_flags(settings)], log_path, env,
                          forked=forked)


PROBE_AGENT = "site-probe"


def wait_listening(process: ManagedProcess, broker_url: str, federation: str, timeout_s: float = 60.0) -> None:
    """Until the site aggregator hears its broker: agents' updates are not retained, so one sent before it first
    subscribed is lost (after that its persistent session keeps them). It is probed with a message that is not an
    update, which it refuses and logs (counted once under ``malformed``); raises if it exits or stays deaf."""
    address = BrokerAddress.parse(broker_url)
    topic = Topics(federation).update(PROBE_AGENT, 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.running:
            raise RuntimeError(f"{process.name} exited with {process.returncode}: {process.log_tail(5)}")
        publish.single(topic, b"probe", qos=1, hostname=address.host, port=address.port)
        try:
            if f"update from {PROBE_AGENT}" in process.log_path.read_text(errors="replace"):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{process.name} did not hear {broker_url} within {timeout_s:.0f}s: {process.log_tail(5)}")


# -- sites of the demo (fl-demo --sites N) ------------------------------------------------
@dataclass
class DemoSites:
    """``count`` sites for a demo: a Mosquitto each, bridged to the root broker, and a site aggregator each;
    the agents are dealt to them in turn (their ``broker_url``). Brokers know their URLs before they start."""

    run_dir: Path
    federation: str
    brokers: dict[str, MosquittoBroker]
    aggregators: dict[str, ManagedProcess] = field(default_factory=dict)
    agents: dict[str, list[str]] = field(default_factory=dict)
    """site -> the agents it serves."""

    @classmethod
    def plan(cls, run_dir: Path, federation: str, count: int, root_url: str) -> DemoSites:
        root = BrokerAddress.parse(root_url)
        brokers = {}
        for k in range(count):
            site_id = f"site{k + 1}"
            brokers[site_id] = MosquittoBroker(workdir=run_dir / "sites" / site_id / "broker", settings=bridge_settings(
                federation, site_id, root.host, root.port))
        return cls(run_dir, federation, brokers)

    def deal(self, agents: list[AgentSpec]) -> list[AgentSpec]:
        """The agents, each pointed at its site's broker (in turn)."""
        sites = list(self.brokers)
        out = []
        for i, agent in enumerate(agents):
            site_id = sites[i % len(sites)]
            self.agents.setdefault(site_id, []).append(agent.name)
            out.append(replace(agent, settings={**agent.settings, "broker_url": self.brokers[site_id].url}))
        return out

    def start(self, fleet: Fleet, settings: Mapping[str, Any]) -> None:
        """After the coordinator started (its state dir holds its key): the brokers, the sites' enrollment at the
        root (``coordinator enroll``, as for agents), and the aggregators, each once it hears its broker (agents'
        updates are not retained: one sent before it listens would be lost). ``settings``: the root's own that a
        site shares (algorithm, task...)."""
        for broker in self.brokers.values():
            broker.start()
        bundles = self.run_dir / "sites"
        argv = [sys.executable, "-m", "coordinator", "enroll", *self.brokers, "--state-dir",
                str(fleet.coordinator_dir), "--bundle-dir", str(bundles)]
        run_to_end("enrolling the sites", argv, bundles / "enroll.log", fleet.coordinator.env)  # its fork server
        for site_id, broker in self.brokers.items():
            bundle = bundles / site_id
            self.aggregators[site_id] = site_aggregator(f"site-{site_id}", {
                **settings, "federation": self.federation, "broker_url": broker.url, "site_id": site_id,
                "state_dir": bundle / "state", "enrolled_agents_file": fleet.coordinator_dir / "enrolled.json",
                "signing_key_file": bundle / "agent_key.pem", "coordinator_key": bundle / "coordinator.pub",
                "log_level": "INFO"}, bundle / "site.log", {**os.environ, "PYTHONUNBUFFERED": "1"}).start()
        for site_id, process in self.aggregators.items():
            wait_listening(process, self.brokers[site_id].url, self.federation)

    def processes(self) -> list[ManagedProcess]:
        return list(self.aggregators.values())

    def stop(self) -> None:
        for process in self.aggregators.values():
            process.terminate(5.0)
        for broker in self.brokers.values():
            broker.stop()


def site_totals(rounds: Sequence[RoundSummary]) -> dict[str, dict[str, int]]:
    """site -> its counts (accepted, rejected, stragglers, bytes kept at the site, bytes up) summed over rounds."""
    totals: dict[str, dict[str, int]] = {}
    for summary in rounds:
        for site_id, counts in summary.sites.items():
            mine = totals.setdefault(site_id, {})
            for name, value in counts.items():
                mine[name] = mine.get(name, 0) + int(value)
    return totals


def sites_line(rounds: Sequence[RoundSummary]) -> str:
    """The progress line: each site's agents counted in the last round and its bytes up the bridge so far."""
    if not rounds:
        return ""
    totals, last = site_totals(rounds), rounds[-1].sites
    return "; ".join(f"{s}: {last.get(s, {}).get('accepted', 0)} answered, {human_bytes(t.get('bytes_up', 0))} up"
                     for s, t in sorted(totals.items()))


def sites_table(sites: DemoSites, rounds: Sequence[RoundSummary]) -> Table:
    """Per site, over the run: its agents, what they counted for, bytes that stayed at the site and bytes that
    crossed its bridge; the root's row: every device's update, had they all come to it."""
    table = Table(title="sites (the root's view, from rounds.jsonl)")
    for column in ("site", "agents", "accepted", "rejected", "stragglers", "kept at site", "up the bridge"):
        table.add_column(column, justify="left" if column == "site" else "right")
    totals = site_totals(rounds)
    for site_id, agents in sites.agents.items():
        t = totals.get(site_id, {})
        table.add_row(site_id, str(len(agents)), str(t.get("accepted", 0)), str(t.get("rejected", 0)),
                      str(t.get("stragglers", 0)), human_bytes(t.get("bytes", 0)), human_bytes(t.get("bytes_up", 0)))
    return table
