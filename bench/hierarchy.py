"""Sites against flat: N light agents over S sites (a Mosquitto per site bridged to the root's, a site
aggregator each) and the same N agents on one coordinator, in one run, with the same updates.

    python bench/hierarchy.py --quick                       # 2 sites x 20 agents, 10k parameters: CI
    python bench/hierarchy.py --quick --algorithm scaffold  # the same under SCAFFOLD: x and c equal flat's
    python bench/hierarchy.py --agents 1000 --sites 10      # 127k parameters
    python bench/hierarchy.py --agents 10000 --sites 10 --params 127000 --rounds 3
    python bench/hierarchy.py --agents 100000 --sites 10 --params 10000 --sites-only   # sites alone

Everything is a real process on this machine: the root Mosquitto, one bridged Mosquitto per site
(launcher/sites.py: the topics of deploy/mosquitto/site-bridge.conf), the root coordinator
(``coordinator run``, enrollment open as in bench/scale.py) and one ``coordinator site`` per site;
the agents are bench/lightfleet.py's light, protocol-correct agents, one fleet per site broker.
The flat run has one fleet of N agents on the root broker with as many publisher connections as
all the sites together, so that every agent sends the same update (num_samples and delta) in both
runs: the mean must come out the same. Plain FedAvg in both (claim_cap_multiple and max_norm_ratio
0): those median-based bounds are each site's own, against its own median, so they differ by design.
``--algorithm scaffold``: the agents add a control delta, and the server control variate must come out the
same too.

Per run: the median round time (``duration_s`` of rounds.jsonl, bootstrap excluded); the root
coordinator's CPU seconds per round (/proc, first close to last) and peak RSS (VmHWM); bytes the
root coordinator took in per round (``bytes_in``: updates flat, partials with sites); bytes the
root broker received per round (Mosquitto's ``$SYS/broker/bytes/received``, sampled at each close:
every client's traffic, statuses and the bridges' included); the site aggregators' CPU seconds per
round, together; updates the fleet's broker acknowledged against those the root counted. Then the
final global state's largest absolute difference from flat's.

All on one machine: brokers, fleets, site aggregators and the root share its cores, so round times
with sites include every site's work (on real sites it runs in parallel, elsewhere). The script
exits 0 whatever the results: verdicts are printed, not raised.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from lightfleet import LightFleet, agent_ids
from paho.mqtt.enums import CallbackAPIVersion
from procstat import cpu_seconds, proc_status
from scale_run import TRANSPORT_BYTES_PER_S, RoundsLog, human, start_coordinator, watch

from launcher.broker import MosquittoBroker
from launcher.fleet import ManagedProcess
from launcher.sites import site_aggregator, site_broker, wait_listening
from protocol.limits import DecodeLimits
from protocol.messages import MAX_AGENTS_PER_ROUND, GlobalState
from protocol.topics import Topics
from protocol.transport.chunking import Reassembler, receive
from protocol.transport.mqtt import BrokerAddress

FEDERATION = "hier"
FAMILY = "bench"
PUBLISHERS_PER_SITE = 2
EQUAL_ATOL = 1e-7
"""The final states agree to float32 storage of float64 sums added in another order."""
BYTES_GOAL = 100.0
"""At least this many times fewer bytes into the root than flat, from 1,000 agents per site up."""
SYS_BYTES = "$SYS/broker/bytes/received"


class SiteFleet(LightFleet):
    """A site's light agents, with ids of their own (``prefix``, as long as LightFleet's "sim")."""

    def __init__(self, url: str, count: int, num_params: int, prefix: str, publishers: int) -> None:
        super().__init__(url, FEDERATION, count, num_params, family=FAMILY, publishers=publishers)
        self.ids = agent_ids(count, prefix)
        self.share = {p.name: self.ids[i::len(self.publishers)] for i, p in enumerate(self.publishers)}


class BrokerBytes:
    """A Mosquitto's ``$SYS/broker/bytes/received``, as last published (every ``sys_interval``: 1 s here)."""

    def __init__(self, url: str) -> None:
        address = BrokerAddress.parse(url)
        self.value: int | None = None
        self._seen = 0
        self._cond = threading.Condition()
        self._client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="bench-sys",
                                   protocol=paho.MQTTv311)
        self._client.on_connect = lambda c, u, f, r, p: c.subscribe(SYS_BYTES, qos=0)
        self._client.on_message = self._on_message
        self._client.connect(address.host, address.port)
        self._client.loop_start()

    def _on_message(self, client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        with self._cond:
            self.value = int(message.payload)
            self._seen += 1
            self._cond.notify_all()

    def fresh(self, timeout_s: float = 10.0) -> int | None:
        """The counter as published after this call. Mosquitto publishes it only when it changed, so a few bytes
        nudge it; the second publication after the call counts everything received before the call."""
        for _ in range(2):
            with self._cond:
                seen = self._seen
            self._client.publish("bench/nudge", b"1", qos=0)
            with self._cond:
                if not self._cond.wait_for(lambda seen=seen: self._seen > seen, timeout_s):
                    return None
        return self.value

    def stop(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def final_state(url: str, timeout_s: float = 30.0) -> GlobalState | None:
    """The newest retained global state of the bench family on the root broker."""
    topics, address = Topics(FEDERATION), BrokerAddress.parse(url)
    states: dict[int, GlobalState] = {}
    reassembler = Reassembler(max_transfers=4)
    heard = threading.Event()

    def on_message(client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        parsed = topics.parse(message.topic)
        if parsed.kind == "global_state" and parsed.round is not None and message.payload:
            received = receive(message.payload, "coordinator", GlobalState, reassembler, DecodeLimits())
            if received is not None:
                states[parsed.round] = received.message
                heard.set()

    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="bench-state",
                         protocol=paho.MQTTv311)
    client.on_connect = lambda c, u, f, r, p: c.subscribe(topics.global_states_of(FAMILY), qos=1)
    client.on_message = on_message
    client.connect(address.host, address.port)
    client.loop_start()
    try:
        if not heard.wait(timeout_s):
            return None
        time.sleep(1.0)  # retained states of older rounds, if any are still kept, arrive together
    finally:
        client.disconnect()
        client.loop_stop()
    return states[max(states)] if states else None


@dataclass
class Run:
    label: str
    records: list[dict[str, Any]] = field(default_factory=list)
    root_cpu: list[float] = field(default_factory=list)
    site_cpu: list[float] = field(default_factory=list)
    broker_bytes: list[int] = field(default_factory=list)
    """The root broker's received-bytes counter before the fleets started and after the last round."""
    peak_rss: int | None = None
    sent: int = 0
    state: GlobalState | None = None
    error: str | None = None

    @property
    def timed(self) -> list[dict[str, Any]]:
        return self.records[1:]  # the first round bootstraps

    @property
    def round_s(self) -> float | None:
        return statistics.median(r["duration_s"] for r in self.timed) if self.timed else None

    @property
    def root_bytes_in(self) -> float | None:
        return statistics.median(r["bytes_in"] for r in self.timed) if self.timed else None

    @staticmethod
    def per_round(samples: list[float] | list[int]) -> float | None:
        return (samples[-1] - samples[0]) / (len(samples) - 1) if len(samples) >= 2 else None

    @property
    def broker_in(self) -> float | None:
        """Bytes into the root broker per round, over the whole run."""
        return (self.broker_bytes[-1] - self.broker_bytes[0]) / len(self.records) \
            if len(self.broker_bytes) == 2 and self.records else None

    @property
    def accepted(self) -> int:
        return sum(int(r["answered"]) - int(r.get("rejected", 0)) for r in self.records)


def run_one(label: str, run_dir: Path, agents: int, sites: int, params: int, rounds: int,
            max_rss: int | None, flat_publishers: int, algorithm: str = "fedavg") -> Run:
    """Sites == 0: flat, on ``flat_publishers`` connections (as many as all the sites' fleets have)."""
    run = Run(label)
    update_bytes = params * 4 + 2048
    deadline = round(60.0 + agents * update_bytes / TRANSPORT_BYTES_PER_S)
    root = MosquittoBroker(workdir=run_dir / "root-broker", settings="sys_interval 1")
    brokers: list[MosquittoBroker] = []
    aggregators: list[ManagedProcess] = []
    fleets: list[LightFleet] = []
    coordinator: ManagedProcess | None = None
    meter: BrokerBytes | None = None
    try:
        root.start()
        meter = BrokerBytes(root.url)
        # Plain FedAvg: the median-based bounds (claim cap, norm clip) are each site's own, against its own median
        # (docs/architecture.md), so with them the two runs clip differently by design.
        limits = {"max_update_bytes": max(256 << 20, 4 * update_bytes), "log_level": "WARNING",
                  "claim_cap_multiple": 0, "max_norm_ratio": 0, "max_known_agents": max(50_000, 2 * agents),
                  "algorithm": algorithm}
        coordinator = start_coordinator(run_dir, root.url, rounds, {
            # a round selects at most MAX_AGENTS_PER_ROUND (the announcement lists them): larger fleets are sampled
            "federation": FEDERATION, "min_fit_agents": min(agents, MAX_AGENTS_PER_ROUND), "min_available_agents": agents,
            "round_deadline_s": deadline, **limits})
        per_site = agents // max(1, sites)
        for k in range(sites):
            site_id = f"s{k:02d}"
            broker = site_broker(run_dir / f"{site_id}-broker", FEDERATION, site_id, root).start()
            brokers.append(broker)
            aggregators.append(site_aggregator(site_id, {
                "federation": FEDERATION, "broker_url": broker.url, "site_id": site_id,
                "state_dir": run_dir / site_id, "enrollment": "open", **limits}, run_dir / site_id / "site.log",
                {**os.environ, "PYTHONUNBUFFERED": "1"}, forked=False).start())  # its CPU seconds count its imports
        for aggregator, broker in zip(aggregators, brokers, strict=True):
            wait_listening(aggregator, broker.url, FEDERATION)
        start = meter.fresh()
        if start is not None:
            run.broker_bytes.append(start)
        for k, broker in enumerate(brokers):
            fleets.append(SiteFleet(broker.url, per_site, params, f"s{k:02d}", PUBLISHERS_PER_SITE).start())
        if not sites:
            fleets.append(LightFleet(root.url, FEDERATION, agents, params, family=FAMILY,
                                     publishers=flat_publishers).start())
        log = RoundsLog(run_dir / "coordinator" / "rounds.jsonl")

        def on_round(record: dict[str, Any], pid: int) -> None:
            seconds = cpu_seconds(pid)
            if seconds is not None:
                run.root_cpu.append(seconds)
            run.site_cpu.append(sum(cpu_seconds(a.pid) or 0.0 for a in aggregators if a.pid is not None))

        run.error = watch(coordinator, log, rounds, 120.0 + rounds * deadline * 1.5, 0.1, on_round, max_rss)
        run.records = log.records
        end = meter.fresh()
        if end is not None and run.broker_bytes:
            run.broker_bytes.append(end)
        if coordinator.pid is not None:
            run.peak_rss = proc_status(coordinator.pid).get("VmHWM")
        errors = [e for f in fleets for e in f.errors] + [f"site {a.name} exited: {a.log_tail(3)}"
                                                          for a in aggregators if not a.running]
        if errors and run.error is None:
            run.error = errors[0]
        for fleet in fleets:
            fleet.drain(60.0)
        run.sent = sum(f.acked for f in fleets)
        run.state = final_state(root.url) if run.error is None else None
    except Exception as exc:  # noqa: BLE001 - a crash fails this run, not the bench
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        for fleet in fleets:
            fleet.stop()
        for aggregator in aggregators:
            aggregator.terminate(10.0)
        if coordinator is not None:
            coordinator.terminate(30.0)
        if meter is not None:
            meter.stop()
        for broker in [*brokers, root]:
            broker.stop()
    return run


def max_difference(a: GlobalState | None, b: GlobalState | None) -> float | None:
    """The largest |difference| over the weights and (SCAFFOLD) the server control variate."""
    if a is None or b is None or a.weights.keys() != b.weights.keys() or a.control.keys() != b.control.keys():
        return None
    pairs = [(a.weights[n], b.weights[n]) for n in a.weights] + [(a.control[n], b.control[n]) for n in a.control]
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in pairs)


def kb(value: float | None) -> float | None:
    return value / 1e3 if value is not None else None


def fmt(value: float | None, spec: str) -> str:
    return "-".rjust(int(spec.split(".")[0] or 0)) if value is None else format(value, spec)


def table(runs: list[Run]) -> list[str]:
    head = (f"{'run':<22} {'round s':>8} {'root CPU s/rd':>13} {'root RSS MB':>11} {'root in kB/rd':>13} "
            f"{'broker in kB/rd':>15} {'sites CPU s/rd':>14} {'counted/sent':>13}  status")
    lines = [head, "-" * len(head)]
    for r in runs:
        lines.append(
            f"{r.label:<22} {fmt(r.round_s, '8.3f')} {fmt(Run.per_round(r.root_cpu), '13.3f')} "
            f"{fmt(r.peak_rss / 1e6 if r.peak_rss else None, '11.0f')} {fmt(kb(r.root_bytes_in), '13.1f')} "
            f"{fmt(kb(r.broker_in), '15.1f')} "
            f"{fmt(Run.per_round(r.site_cpu) if r.site_cpu and r.site_cpu[-1] else None, '14.3f')} "
            f"{f'{r.accepted}/{r.sent}':>13}  {r.error or 'ok'}")
    return lines


def verdicts(flat: Run, sites: Run, per_site: int) -> list[tuple[str, str]]:
    out = []
    diff = max_difference(flat.state, sites.state)
    out.append(("PASS" if diff is not None and diff <= EQUAL_ATOL else "MISS",
                f"final state with sites equals flat's (max |difference| <= {EQUAL_ATOL:g}): {fmt(diff, '.3g')}"))
    lost = [r.label for r in (flat, sites) if r.error or r.accepted != r.sent]
    out.append(("MISS" if lost else "PASS", "every acknowledged update counted once (counted == sent)"
                + (f"; not so in {', '.join(lost)}" if lost else "")))
    flat_in, site_in = flat.broker_in, sites.broker_in
    ratio = flat_in / site_in if flat_in and site_in else None
    goal = BYTES_GOAL if per_site >= 1000 else 1.0
    out.append(("PASS" if ratio is not None and ratio > goal else "MISS",
                f"bytes into the root broker per round, flat / sites > {goal:g}: {fmt(ratio, '.1f')}x"))
    root_ratio = (flat.root_bytes_in / sites.root_bytes_in if flat.root_bytes_in and sites.root_bytes_in else None)
    out.append(("INFO", f"bytes into the root coordinator per round, flat / sites: {fmt(root_ratio, '.1f')}x"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 sites x 20 agents, 10k parameters, 3 rounds: CI")
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--params", type=int, default=127_000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run, the first bootstrapping")
    parser.add_argument("--max-rss-gb", type=float, default=12.0, help="kill a root coordinator above this RSS")
    parser.add_argument("--algorithm", choices=("fedavg", "scaffold"), default="fedavg",
                        help="scaffold: agents send control deltas too; the variate is compared as well")
    parser.add_argument("--sites-only", action="store_true",
                        help="skip the flat run (fleets too large for one coordinator here): no comparison")
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.sites, args.params, args.rounds = 40, 2, 10_000, 3
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: the first bootstraps, and a rate needs two timed closes")
    if args.sites < 1 or args.agents % args.sites:
        parser.error("--agents must be a positive multiple of --sites (the same number of agents at each site)")
    per_site = args.agents // args.sites
    print(f"hierarchy benchmark: python {platform.python_version()}, {os.cpu_count()} CPUs; {args.agents} agents x "
          f"{human(args.params)} parameters, {args.rounds} rounds (the first bootstraps), {args.algorithm}, mean"
          f"{' (quick)' if args.quick else ''}", flush=True)
    runs = []
    plan = [(f"flat {args.agents}", 0), (f"{args.sites} sites x {per_site}", args.sites)]
    for label, sites in plan[1:] if args.sites_only else plan:
        started = time.monotonic()
        run_dir = Path(tempfile.mkdtemp(prefix="fl-hier-"))
        try:
            runs.append(run_one(label, run_dir, args.agents, sites, args.params, args.rounds,
                                int(args.max_rss_gb * 1e9), PUBLISHERS_PER_SITE * args.sites, args.algorithm))
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        print(f"  {label}: {time.monotonic() - started:.0f}s | {table(runs[-1:])[-1].strip()}", flush=True)
    print()
    print("\n".join(table(runs)))
    print()
    if args.sites_only:
        print("INFO  flat not run (--sites-only): nothing to compare with")
        return 0
    for verdict, text in verdicts(runs[0], runs[1], per_site):
        print(f"{verdict}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
